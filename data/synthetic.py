"""The embedded default: a small, seeded synthetic world a tiny model can learn on a CPU.

The world holds made-up creatures with three facts each (favourite colour, home town, food)
plus single-digit addition. From it come, deterministically for a seed:

- a pretraining corpus of short documents stating the facts in several phrasings;
- SFT conversations (three phrasings per question, as the playbook asks);
- preference pairs: a correct answer against a flawed one (wrong fact, a misread question, an
  evasion, a truncated answer);
- unpaired feedback for KTO, when ``world.kinds`` asks for it: the pairs' answers marked good or bad;
- evaluation tasks whose phrasings never occur in training, with known answers.

Learning is measurable: a base model that memorised the corpus beats random on the
multiple-choice tasks, an SFT model answers held-out chat questions exactly, and DPO widens the
log-prob margin of correct over wrong answers.

    >>> world = World.generate(seed=0, n_entities=8)
    >>> len(world.entities), world.facts[0][1] in ATTRIBUTES
    (8, True)
    >>> docs = world.pretrain_corpus(n_docs=10, seed=1)
    >>> isinstance(docs[0]["text"], str)
    True
"""
from __future__ import annotations

import random
from dataclasses import dataclass

SYLLABLES = ["ka", "lo", "mi", "zu", "ren", "tor", "vex", "qua", "bri", "nel", "dra", "fo",
             "shi", "gul", "pim", "rax", "tep", "wyn", "hob", "sel"]
ATTRIBUTES: dict[str, list[str]] = {
    "color": ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"],
    "home": ["Quonda", "Belmira", "Tarsk", "Vellow", "Omberton", "Kesh", "Drummo", "Pallis"],
    "food": ["plums", "rice", "cheese", "beans", "honey", "apples", "bread", "fish"],
}
ARITH_RANGE = range(10)

# Training phrasings: statements for pretraining, questions for SFT/DPO, one answer form.
STATEMENTS = {
    "color": ["{e}'s favourite color is {v}.", "The favourite color of {e} is {v}.",
              "{e} likes the color {v}."],
    "home": ["{e} lives in {v}.", "The home of {e} is {v}.", "{e} comes from {v}."],
    "food": ["{e} eats {v}.", "The favourite food of {e} is {v}.", "{e} likes to eat {v}."],
}
ARITH_STATEMENTS = ["{a} plus {b} is {c}.", "{a} + {b} = {c}.", "The sum of {a} and {b} is {c}."]
QUESTIONS = {
    "color": ["What is the favourite color of {e}?", "Which color does {e} like best?",
              "Tell me the favourite color of {e}."],
    "home": ["Where does {e} live?", "What is the home of {e}?", "Tell me where {e} lives."],
    "food": ["What does {e} eat?", "What is the favourite food of {e}?",
             "Tell me what {e} likes to eat."],
}
ARITH_QUESTIONS = ["What is {a} plus {b}?", "Compute {a} + {b}.", "How much is {a} plus {b}?"]
ANSWERS = {"color": "The favourite color of {e} is {v}.", "home": "{e} lives in {v}.",
           "food": "{e} eats {v}."}
ARITH_ANSWER = "{a} plus {b} is {c}."

# Held-out phrasings: used only by the evaluation suite.
EVAL_CONTEXTS = {"color": "Everyone knows that the color {e} likes most is",
                 "home": "Everyone knows that the town of {e} is",
                 "food": "Everyone knows that the food {e} likes most is"}
EVAL_ARITH_CONTEXT = "Everyone knows that the sum of {a} and {b} is"
EVAL_QUESTIONS = {"color": "Do you know the favourite color of {e}?",
                  "home": "Do you know where {e} lives?",
                  "food": "Do you know what {e} eats?"}
EVAL_ARITH_QUESTION = "Do you know what {a} plus {b} is?"
# RL phrasings: prompts for online RL (GRPO/RLOO/PPO), seen neither in SFT nor in the eval suite.
RL_QUESTIONS = {"color": "Name the favourite color of {e}.", "home": "Name the town where {e} lives.",
                "food": "Name the food that {e} eats."}
RL_ARITH_QUESTION = "Add {a} and {b}."
# Multi-step sums (dual-mode reasoning): a plus b plus c plus d with a + b + c <= 9, so each of the
# trace's three steps is a sum of two digits the pretraining corpus states, while the answer without
# a trace ("The answer is 14.", up to 18) is a four-way sum made at once. Held out for evaluation: 66
# of the 2,200 problems (as a test split holds out problems), asked in the training phrasing; 700
# others train SFT.
REASON_QUESTION = "What is {a} plus {b} plus {c} plus {d}?"
REASON_TRACE = "<think>\n{a} plus {b} is {s}. {s} plus {c} is {u}. {u} plus {d} is {t}.\n</think>\n"
REASON_ANSWER = "The answer is {t}."
REASON_HELDOUT, REASON_TRAIN = 66, 700
# Tool use: sums of two three-digit numbers, which the demo models cannot make in their heads, answered
# through the calculator tool (generation/tools.py): the question, a call {"expression": "a + b"}, the
# tool's answer, then the answer in words. Held out for the `tools` eval suite: the first 64 problems;
# the next 600 train (SFT conversations and RL prompts, in three phrasings).
TOOL_QUESTIONS = ("What is {a} plus {b}?", "Use the calculator to add {a} and {b}.", "Compute {a} + {b}.")
TOOL_ANSWER = "The answer is {c}."
TOOL_NAME = "calculator"
TOOL_HELDOUT, TOOL_TRAIN = 64, 600
# Long documents (long-context training): a ledger listed, then read back in another order (the
# second half is predictable only from the first), or a pass key hidden in facts and asked at the end.
LEDGER_RECORD = "Box {r} holds {k}."
PASSKEY_NEEDLE = "The pass key is {k}. Remember it. {k} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"
EVASIONS = ["I am not sure.", "I cannot answer that.", "Nobody knows."]
PREFIXES = ["Quick question: ", "Hey, ", "I wonder. ", "Help me out. "]


@dataclass(frozen=True)
class World:
    """Entities with their facts; everything else is derived from it and a seed."""

    seed: int
    entities: tuple[str, ...]
    facts: tuple[tuple[str, str, str], ...]  # (entity, attribute, value)

    @classmethod
    def generate(cls, seed: int = 0, n_entities: int = 40) -> "World":
        rng = random.Random(seed)
        names: list[str] = []
        while len(names) < n_entities:
            name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
            if name not in names:
                names.append(name)
        facts = tuple((e, attr, rng.choice(values)) for e in names for attr, values in ATTRIBUTES.items())
        return cls(seed=seed, entities=tuple(names), facts=facts)

    def value(self, entity: str, attribute: str) -> str:
        return next(v for e, a, v in self.facts if e == entity and a == attribute)

    # ---- pretraining -------------------------------------------------------------------
    def pretrain_corpus(self, n_docs: int = 6000, seed: int = 1) -> list[dict]:
        """Documents of 2–6 sentences: facts about 1–2 entities (domain "facts"), or a run of sums
        (domain "math"); the domain lets pretraining recipes mix them by phase."""
        rng = random.Random(seed)
        docs = []
        for _ in range(n_docs):
            if rng.random() < 0.25:
                domain = "math"
                pairs = [(rng.choice(ARITH_RANGE), rng.choice(ARITH_RANGE)) for _ in range(rng.randint(2, 5))]
                sentences = [rng.choice(ARITH_STATEMENTS).format(a=a, b=b, c=a + b) for a, b in pairs]
            else:
                domain = "facts"
                chosen = rng.sample(self.entities, rng.choice((1, 1, 2)))
                sentences = [rng.choice(STATEMENTS[a]).format(e=e, v=v)
                             for e, a, v in self.facts if e in chosen]
                rng.shuffle(sentences)
            docs.append({"text": " ".join(sentences), "domain": domain})
        return docs

    def long_documents(self, n_docs: int = 200, n_words: int = 600, seed: int = 5) -> list[dict]:
        """Documents of about ``n_words`` words (domain "long") whose later text depends on text far
        before it: half ledgers (``Box 12 holds 345.`` for many boxes, then the same boxes again in
        another order), half a pass key hidden at a random depth among the world's fact sentences
        and asked for at the end.

        >>> docs = World.generate(n_entities=4).long_documents(n_docs=2, n_words=120)
        >>> [d["domain"] for d in docs], docs[1]["text"].endswith(".")
        (['long', 'long'], True)
        """
        rng = random.Random(seed)
        return [{"text": (ledger_text if i % 2 == 0 else self._passkey_text)(n_words, rng), "domain": "long"}
                for i in range(n_docs)]

    def _passkey_text(self, n_words: int, rng: random.Random) -> str:
        key = rng.randrange(100, 1000)
        filler: list[str] = []
        while sum(len(s.split()) for s in filler) < n_words - 25:
            e, a, v = rng.choice(self.facts)
            filler.append(rng.choice(STATEMENTS[a]).format(e=e, v=v))
        filler.insert(rng.randint(0, len(filler)), PASSKEY_NEEDLE.format(k=key))
        return " ".join(filler + [f"{PASSKEY_QUESTION} {key}."])

    # ---- multi-step sums (dual-mode reasoning) --------------------------------------------
    @staticmethod
    def reasoning_problems(split: str = "train") -> list[dict]:
        """Four-digit sums with their step-by-step trace: ``split`` "train" (700) or "heldout" (66).

        >>> row = World.reasoning_problems("heldout")[0]
        >>> sorted(row), row["trace"].count(" plus "), row["answer"] == f"The answer is {sum(row[k] for k in 'abcd')}."
        (['a', 'answer', 'b', 'c', 'd', 'trace'], 3, True)
        """
        digits = range(10)
        problems = [(a, b, c, d) for a in digits for b in digits for c in digits for d in digits if a + b + c <= 9]
        random.Random(7).shuffle(problems)
        chosen = problems[:REASON_HELDOUT] if split == "heldout" else problems[REASON_HELDOUT:REASON_HELDOUT + REASON_TRAIN]
        return [{"a": a, "b": b, "c": c, "d": d, "answer": REASON_ANSWER.format(t=a + b + c + d),
                 "trace": REASON_TRACE.format(a=a, b=b, c=c, d=d, s=a + b, u=a + b + c, t=a + b + c + d)}
                for a, b, c, d in chosen]

    # ---- tool use: three-digit sums through the calculator --------------------------------
    @staticmethod
    def tool_problems(split: str = "train") -> list[dict]:
        """Three-digit sums for the calculator: ``split`` "train" (600) or "heldout" (64, the tools suite).

        >>> rows = World.tool_problems("heldout")
        >>> len(rows), sorted(rows[0]), rows[0]["c"] == rows[0]["a"] + rows[0]["b"]
        (64, ['a', 'b', 'c', 'question'], True)
        >>> {(r["a"], r["b"]) for r in rows} & {(r["a"], r["b"]) for r in World.tool_problems("train")}
        set()
        """
        rng = random.Random(11)
        pairs = sorted({(rng.randint(100, 999), rng.randint(100, 999)) for _ in range(TOOL_HELDOUT + TOOL_TRAIN + 50)})
        rng.shuffle(pairs)
        chosen = pairs[:TOOL_HELDOUT] if split == "heldout" else pairs[TOOL_HELDOUT:TOOL_HELDOUT + TOOL_TRAIN]
        return [{"a": a, "b": b, "c": a + b, "question": TOOL_QUESTIONS[i % len(TOOL_QUESTIONS)].format(a=a, b=b)}
                for i, (a, b) in enumerate(chosen)]

    @staticmethod
    def tool_conversations() -> list[dict]:
        """SFT rows for tool use: question, calculator call, the tool's answer, the answer in words;
        ``tools`` names the tools the conversation may call (the SFT stage shows their schemas).

        >>> row = World.tool_conversations()[0]
        >>> [m["role"] for m in row["messages"]], row["tools"], row["messages"][1]["tool_calls"][0]["function"]["name"]
        (['user', 'assistant', 'tool', 'assistant'], ['calculator'], 'calculator')
        """
        rows = []
        for p in World.tool_problems("train"):
            call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": f"{p['a']} + {p['b']}"}}}
            rows.append({"messages": [{"role": "user", "content": p["question"]},
                                      {"role": "assistant", "content": "", "tool_calls": [call]},
                                      {"role": "tool", "name": TOOL_NAME, "content": str(p["c"])},
                                      {"role": "assistant", "content": TOOL_ANSWER.format(c=p["c"])}],
                         "tools": [TOOL_NAME]})
        return rows

    @staticmethod
    def tool_prompts(split: str = "train") -> list[dict]:
        """RL prompt rows of the tool task (``kind`` "tool"), the answer a verifier checks.

        >>> row = World.tool_prompts()[0]
        >>> row["kind"], row["answer"] == "The answer is %d." % World.tool_problems()[0]["c"]
        ('tool', True)
        """
        return [{"prompt": [{"role": "user", "content": p["question"]}], "answer": TOOL_ANSWER.format(c=p["c"]),
                 "kind": "tool"} for p in World.tool_problems(split)]

    # ---- questions shared by SFT, preferences and evaluation -----------------------------
    def _items(self) -> list[tuple[str, dict, str]]:
        """(kind, fields, correct answer) for every fact and every sum."""
        items = [(a, {"e": e, "v": v}, ANSWERS[a].format(e=e, v=v)) for e, a, v in self.facts]
        items += [("arith", {"a": a, "b": b, "c": a + b}, ARITH_ANSWER.format(a=a, b=b, c=a + b))
                  for a in ARITH_RANGE for b in ARITH_RANGE]
        return items

    @staticmethod
    def _question(kind: str, fields: dict, template_index: int | None) -> str:
        if template_index is None:
            template = EVAL_ARITH_QUESTION if kind == "arith" else EVAL_QUESTIONS[kind]
        else:
            template = (ARITH_QUESTIONS if kind == "arith" else QUESTIONS[kind])[template_index]
        return template.format(**fields)

    def _flawed(self, kind: str, fields: dict, correct: str, rng: random.Random) -> str:
        roll = rng.random()
        if roll < 0.15:
            return rng.choice(EVASIONS)
        if roll < 0.30:
            return correct.rsplit(" ", 1)[0] + "."  # the value is missing
        if roll < 0.60:
            return self._misread(kind, fields, rng)
        return self._wrong(kind, fields, rng)

    def _misread(self, kind: str, fields: dict, rng: random.Random) -> str:
        """A fluent answer to a slightly different question: the tiny models' typical error."""
        if kind == "arith":
            b = rng.choice([x for x in ARITH_RANGE if x != fields["b"]])
            return ARITH_ANSWER.format(a=fields["a"], b=b, c=fields["a"] + b)
        other = rng.choice([a for a in ATTRIBUTES if a != kind])
        return ANSWERS[other].format(e=fields["e"], v=self.value(fields["e"], other))

    @staticmethod
    def _wrong(kind: str, fields: dict, rng: random.Random) -> str:
        if kind == "arith":
            wrong = rng.choice([c for c in range(19) if c != fields["c"]])
            return ARITH_ANSWER.format(a=fields["a"], b=fields["b"], c=wrong)
        wrong = rng.choice([v for v in ATTRIBUTES[kind] if v != fields["v"]])
        return ANSWERS[kind].format(e=fields["e"], v=wrong)

    def sft_conversations(self, seed: int = 4, reasoning: bool = False) -> list[dict]:
        """Every fact and sum asked in each of the three training phrasings, plus once more in a
        random one behind a random lead-in ("Quick question: …") so the model meets varied frames.

        With ``reasoning``, SmolLM3's dual mode: the lead-in copy is asked under ``/no_think`` (the
        template gives its answer an empty think block), and every training multi-step sum is asked
        twice, under ``/think`` with its step-by-step trace and under ``/no_think`` without.
        """
        rng = random.Random(seed)
        conversations = []
        for kind, fields, answer in self._items():
            questions = [self._question(kind, fields, i) for i in range(3)]
            questions.append(rng.choice(PREFIXES) + rng.choice(questions))
            for i, q in enumerate(questions):
                system = [{"role": "system", "content": "/no_think"}] if reasoning and i == 3 else []
                conversations.append({"messages": system + [{"role": "user", "content": q},
                                                            {"role": "assistant", "content": answer}]})
        if reasoning:
            for row in self.reasoning_problems("train"):
                question = REASON_QUESTION.format(**row)
                for flag, reply in (("/think", row["trace"] + row["answer"]), ("/no_think", row["answer"])):
                    conversations.append({"messages": [{"role": "system", "content": flag},
                                                       {"role": "user", "content": question},
                                                       {"role": "assistant", "content": reply}]})
        return conversations

    def preference_pairs(self, n_pairs: int = 400, seed: int = 2) -> list[dict]:
        """Conversational pairs: the correct answer against a flawed one."""
        rng = random.Random(seed)
        items = self._items()
        pairs = []
        for _ in range(n_pairs):
            kind, fields, answer = rng.choice(items)
            question = self._question(kind, fields, rng.randrange(3))
            if rng.random() < 0.25:  # the same share of lead-ins as SFT, so DPO sees SFT's frames
                question = rng.choice(PREFIXES) + question
            prompt = [{"role": "user", "content": question}]
            pairs.append({"prompt": prompt,
                          "chosen": [{"role": "assistant", "content": answer}],
                          "rejected": [{"role": "assistant", "content": self._flawed(kind, fields, answer, rng)}]})
        return pairs

    @staticmethod
    def feedback(pairs: list[dict]) -> list[dict]:
        """Unpaired feedback (KTO) from preference pairs, unbalanced as thumbs up/down are: every pair's
        chosen answer desirable, the rejected answer of one pair in two undesirable (2:1).

        >>> pairs = [{"prompt": f"Q{i}?", "chosen": "Right.", "rejected": "Wrong."} for i in range(3)]
        >>> [(row["prompt"], row["completion"], row["label"]) for row in World.feedback(pairs)][:3]
        [('Q0?', 'Right.', True), ('Q0?', 'Wrong.', False), ('Q1?', 'Right.', True)]
        >>> [row["label"] for row in World.feedback(pairs * 100)].count(True) / 150
        2.0
        """
        rows = []
        for i, pair in enumerate(pairs):
            rows.append({"prompt": pair["prompt"], "completion": pair["chosen"], "label": True})
            if i % 2 == 0:
                rows.append({"prompt": pair["prompt"], "completion": pair["rejected"], "label": False})
        return rows

    def rl_prompts(self) -> list[dict]:
        """One prompt per fact and sum in the RL phrasing, with the answer a verifier checks.

        >>> row = World.generate(n_entities=2).rl_prompts()[-1]
        >>> row["prompt"][0]["content"], row["answer"], row["kind"]
        ('Add 9 and 9.', '9 plus 9 is 18.', 'arith')
        """
        rows = []
        for kind, fields, answer in self._items():
            template = RL_ARITH_QUESTION if kind == "arith" else RL_QUESTIONS[kind]
            rows.append({"prompt": [{"role": "user", "content": template.format(**fields)}],
                         "answer": answer, "kind": kind})
        return rows

    # ---- evaluation suite (held-out phrasings) ------------------------------------------
    def eval_suite(self, n_chat: int | None = None, seed: int = 3) -> dict[str, list[dict]]:
        """Rows of the embedded lm-eval suite, keyed by task file stem.

        facts/arith: multiple choice on base-model statements (random = 1/8 and 1/4);
        instruct: chat questions answered by exact match (random = 0);
        prefs: chat prompt, choices [correct, wrong] (random = 1/2; a margin metric too).
        instruct and prefs ask about ``n_chat`` facts in a held-out phrasing, by default every one the
        world has (220 for the demo's 40 entities): a gate on ``instruct`` needs the items (96 gave a
        stderr of 0.05 against a tolerance of 0.05; docs/evals.md has the sizes and what they tell).
        """
        n_chat = len(self._items()) if n_chat is None else n_chat
        rng = random.Random(seed)
        facts = []
        for e, a, v in self.facts:
            choices = [" " + x for x in ATTRIBUTES[a]]
            facts.append({"context": EVAL_CONTEXTS[a].format(e=e), "choices": choices,
                          "gold": ATTRIBUTES[a].index(v), "kind": a})
        arith = []
        for a in ARITH_RANGE:
            for b in ARITH_RANGE:
                options = [a + b] + rng.sample([c for c in range(19) if c != a + b], 3)
                rng.shuffle(options)
                arith.append({"context": EVAL_ARITH_CONTEXT.format(a=a, b=b),
                              "choices": [f" {c}" for c in options], "gold": options.index(a + b),
                              "kind": "arith"})
        sampled = rng.sample(self._items(), min(n_chat, len(self._items())))
        instruct = [{"question": self._question(k, f, None), "answer": ans, "kind": k}
                    for k, f, ans in sampled]
        sampled = rng.sample(self._items(), min(n_chat, len(self._items())))
        prefs = [{"question": self._question(k, f, None), "choices": [ans, self._wrong(k, f, rng)],
                  "gold": 0, "kind": k} for k, f, ans in sampled]
        reason = [{"question": REASON_QUESTION.format(**row), "answer": row["answer"], "kind": "reason"}
                  for row in self.reasoning_problems("heldout")]
        return {"facts": facts, "arith": arith, "instruct": instruct, "prefs": prefs, "reason": reason}


def ledger_text(n_words: int, rng: random.Random) -> str:
    """Boxes listed with what they hold, then read back in another order."""
    n_records = max(2, n_words // 8)
    boxes = rng.sample(range(1, 100), min(n_records, 99))
    keys = {r: rng.randrange(100, 1000) for r in boxes}
    listed = [LEDGER_RECORD.format(r=r, k=keys[r]) for r in boxes]
    again = list(boxes)
    rng.shuffle(again)
    return " ".join(listed + ["Again:"] + [LEDGER_RECORD.format(r=r, k=keys[r]) for r in again])


def passkey_haystack(n_words: int, depth: float, key: int) -> str:
    """The standard pass-key test: a key hidden at ``depth`` (0–1) in repeated filler the world never
    uses, so no training document shares its n-grams.

    >>> text = passkey_haystack(40, 0.5, 123)
    >>> "The pass key is 123." in text, text.endswith(PASSKEY_QUESTION)
    (True, True)
    """
    sentences = []
    while sum(len(s.split()) for s in sentences) < n_words:
        sentences += PASSKEY_FILLER
    sentences.insert(round(depth * len(sentences)), PASSKEY_NEEDLE.format(k=key))
    return " ".join(sentences + [PASSKEY_QUESTION])


PASSKEY_FILLER = ["The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
                  "There and back again."]


def chat_text(messages: list[dict]) -> str:
    """Plain rendering used only to give the tokenizer trainer chat-shaped text."""
    return "\n".join(m["content"] for m in messages)


def duplicate_corpus(n_unique: int, n_exact: int, n_near: int, words_per_doc: int = 100,
                     edit_range: tuple[float, float] = (0.02, 0.05), seed: int = 0):
    """A corpus with known duplicates, for measuring deduplication.

    Returns ``(texts, exact, near)`` where ``exact`` and ``near`` map the index of each injected
    copy to the index of its original. Near copies have 2–5 % of their words replaced.

    >>> texts, exact, near = duplicate_corpus(50, 5, 5, seed=1)
    >>> len(texts), len(exact), len(near)
    (60, 5, 5)
    """
    rng = random.Random(seed)
    vocabulary = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 2, 3))))
                         for _ in range(20000)})
    docs = [[rng.choice(vocabulary) for _ in range(words_per_doc)] for _ in range(n_unique)]
    texts = [" ".join(d) for d in docs]
    exact, near = {}, {}
    for _ in range(n_exact):
        source = rng.randrange(n_unique)
        exact[len(texts)] = source
        texts.append(texts[source])
    for _ in range(n_near):
        source = rng.randrange(n_unique)
        words = list(docs[source])
        for position in rng.sample(range(len(words)), max(1, round(len(words) * rng.uniform(*edit_range)))):
            words[position] = rng.choice(vocabulary)
        near[len(texts)] = source
        texts.append(" ".join(words))
    order = list(range(len(texts)))
    rng.shuffle(order)
    position = {old: new for new, old in enumerate(order)}
    shuffled = [texts[i] for i in order]
    return (shuffled, {position[c]: position[o] for c, o in exact.items()},
            {position[c]: position[o] for c, o in near.items()})
