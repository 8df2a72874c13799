"""Hand-written documents of standard lm-eval tasks, in each hub dataset's own row layout.

A few rows per task, to stage with ``smolforge eval stage TASK --from FILE`` where the hub is out of
reach: tests/test_standard_tasks.py scores the tiny model on them, and the same files serve for
scoring a released model (HF in-process or through a vLLM server) on every staged task.

    python tests/standard_task_rows.py OUT_DIR        # writes OUT_DIR/<task>.jsonl for each task

    >>> sorted(ROWS) == sorted(STAGED_TASKS + ["ifeval"])
    True
    >>> GSM8K_ROWS[0]["answer"].rsplit("#### ", 1)[1]
    '18'
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

# openai/gsm8k, config "main": question, answer (the worked solution, then "#### N").
GSM8K_ROWS = [
    {"question": "Mia has 3 boxes with 6 pencils in each box. How many pencils does she have?",
     "answer": "Mia has 3 * 6 = <<3*6=18>>18 pencils.\n#### 18"},
    {"question": "A shop sold 1,200 apples on Monday and 345 apples on Tuesday. How many apples did it sell "
                 "in the two days?",
     "answer": "It sold 1,200 + 345 = <<1200+345=1545>>1,545 apples.\n#### 1545"},
    {"question": "Tom had 20 dollars. He spent 8 dollars on lunch and 5 dollars on a book. How many dollars "
                 "does he have left?",
     "answer": "He spent 8 + 5 = <<8+5=13>>13 dollars.\nHe has 20 - 13 = <<20-13=7>>7 dollars left.\n#### 7"},
]

# allenai/ai2_arc (ARC-Easy / ARC-Challenge): id, question, choices {text, label}, answerKey. Labels are
# letters or digits, and a question has 3 to 5 choices, as on the hub.
ARC_EASY_ROWS = [
    {"id": "Mercury_7179953", "question": "Which part of a plant takes in water from the soil?",
     "choices": {"text": ["leaf", "flower", "root", "stem"], "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
    {"id": "NYSEDREGENTS_2015_4_8", "question": "Which object is a good conductor of electricity?",
     "choices": {"text": ["a wooden spoon", "a copper wire", "a rubber band", "a plastic cup"],
                 "label": ["1", "2", "3", "4"]}, "answerKey": "2"},
    {"id": "Mercury_SC_400038", "question": "What do people use to measure the temperature of the air?",
     "choices": {"text": ["a ruler", "a thermometer", "a balance"], "label": ["A", "B", "C"]}, "answerKey": "B"},
]
ARC_CHALLENGE_ROWS = [
    {"id": "Mercury_SC_415702", "question": "George wants to warm his hands quickly by rubbing them. Which skin "
                                            "surface will produce the most heat?",
     "choices": {"text": ["dry palms", "wet palms", "palms covered with oil", "palms covered with lotion"],
                 "label": ["A", "B", "C", "D"]}, "answerKey": "A"},
    {"id": "MCAS_2004_8_27", "question": "Which of the following is an example of a chemical change?",
     "choices": {"text": ["ice melting", "wood burning", "glass breaking", "sugar dissolving", "water boiling"],
                 "label": ["A", "B", "C", "D", "E"]}, "answerKey": "B"},
    {"id": "TIMSS_2003_8_pg28", "question": "Why does the Moon shine at night?",
     "choices": {"text": ["It makes its own light.", "It reflects light from the Sun.",
                          "It reflects light from the Earth.", "It burns gases."],
                 "label": ["1", "2", "3", "4"]}, "answerKey": "2"},
]

# Rowan/hellaswag: ind, activity_label, ctx_a, ctx_b, ctx, endings, source_id, split, split_type, label (a
# string). lm-eval's process_docs builds the query from activity_label, ctx_a and ctx_b and strips WikiHow's
# [bracketed] markers.
HELLASWAG_ROWS = [
    {"ind": 24, "activity_label": "Roof shingle removal",
     "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
     "ctx": "A man is sitting on a roof. he",
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
     "source_id": "activitynet~v_-JhWjGDPHMY", "split": "val", "split_type": "indomain", "label": "3"},
    {"ind": 92, "activity_label": "Clean and jerk",
     "ctx_a": "A lady walks to a barbell. She bends down and grabs the pole.", "ctx_b": "the lady",
     "ctx": "A lady walks to a barbell. She bends down and grabs the pole. the lady",
     "endings": ["swings and lands in her arms.", "pulls the barbell forward.",
                 "pulls a rope attached to the barbell.", "stands and lifts the weight over her head."],
     "source_id": "activitynet~v_-lJS58hyo1c", "split": "val", "split_type": "zeroshot", "label": "3"},
    {"ind": 1052, "activity_label": "Home and Garden",
     "ctx_a": "[header] How to water a cactus [title] Check the soil.", "ctx_b": "",
     "ctx": "[header] How to water a cactus [title] Check the soil.",
     "endings": ["[step] Water only when the top inch of soil is dry.", "[step] Paint the pot blue.",
                 "[step] Put the cactus in the freezer.", "[step] Water it every hour."],
     "source_id": "wikihow~1726", "split": "val", "split_type": "indomain", "label": "0"},
]

# cais/mmlu, one config per subject: question, subject, choices (4 strings), answer (an int index).
MMLU_SUBJECT = "high_school_geography"
MMLU_ROWS = [
    {"question": "Which of the following is the longest river in Africa?", "subject": MMLU_SUBJECT,
     "choices": ["Congo", "Niger", "Nile", "Zambezi"], "answer": 2},
    {"question": "The Tropic of Cancer lies in which hemisphere?", "subject": MMLU_SUBJECT,
     "choices": ["Northern", "Southern", "Eastern", "Western"], "answer": 0},
    {"question": "What is the term for the movement of people from rural areas to cities?",
     "subject": MMLU_SUBJECT, "choices": ["desertification", "urbanization", "globalization", "diffusion"],
     "answer": 1},
]

# google/IFEval: key, prompt, instruction_id_list, kwargs (one dict per instruction). Not stageable offline
# (lm-eval's checker needs NLTK's punkt_tab data, downloaded at run time); kept for machines that have it.
IFEVAL_ROWS = [
    {"key": 1000, "prompt": "Write a short note to a friend about the weather. Do not use any commas.",
     "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
    {"key": 1001, "prompt": "Describe a cat in at least 3 sentences. Your answer must be in lowercase letters.",
     "instruction_id_list": ["length_constraints:number_sentences", "change_case:english_lowercase"],
     "kwargs": [{"num_sentences": 3, "relation": "at least"}, {}]},
]

MMLU_TASK = f"mmlu_{MMLU_SUBJECT}"
ROWS = {"gsm8k": GSM8K_ROWS, "arc_easy": ARC_EASY_ROWS, "arc_challenge": ARC_CHALLENGE_ROWS,
        "hellaswag": HELLASWAG_ROWS, MMLU_TASK: MMLU_ROWS, "ifeval": IFEVAL_ROWS}
STAGED_TASKS = ["gsm8k", "arc_easy", "arc_challenge", "hellaswag", MMLU_TASK]   # stageable offline


def write_rows(folder: str | Path, tasks: list[str] | None = None) -> dict[str, Path]:
    """Write ``<folder>/<task>.jsonl`` for each task (default: every stageable one); ``{task: path}``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for task in tasks or STAGED_TASKS:
        paths[task] = folder / f"{task}.jsonl"
        paths[task].write_text("".join(json.dumps(row) + "\n" for row in ROWS[task]))
    return paths


if __name__ == "__main__":
    for task, path in write_rows(sys.argv[1] if len(sys.argv) > 1 else ".").items():
        print(f"{task}\t{path}")
