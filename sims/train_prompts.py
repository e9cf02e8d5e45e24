"""Training prompts for the feature draft: templates x subjects, four kinds, deterministic.

The draft is distilled on the verifier's own answers to these prompts (``sims.distill``).
They are of the same four kinds as the held-out set (``sims/prompts/heldout.jsonl``: code,
short answers, explanations, lists) but built from different subjects, and any prompt that
also appears in the held-out set is dropped, so the benchmark never measures a prompt the
draft was trained on.
"""

from __future__ import annotations

import json
from pathlib import Path

HELDOUT = Path(__file__).resolve().parent / "prompts" / "heldout.jsonl"

CODE_TASKS = (
    "reverses the words in a sentence",
    "counts the vowels in a string",
    "returns the largest of three numbers",
    "removes duplicates from a list while keeping the order",
    "computes the factorial of n recursively",
    "checks whether a number is prime",
    "merges two sorted lists into one sorted list",
    "returns the second largest number in a list",
    "converts Celsius to Fahrenheit",
    "flattens a nested list of lists",
    "counts how often each word appears in a text",
    "returns the greatest common divisor of two integers",
    "checks whether two strings are anagrams",
    "finds the longest word in a sentence",
    "rotates a list by k positions",
    "sums the digits of an integer",
    "transposes a matrix given as a list of lists",
    "returns all even numbers from a list",
    "capitalises the first letter of every word",
    "computes the average of a list of numbers",
    "checks whether a year is a leap year",
    "converts a binary string to an integer",
    "finds the index of a value with binary search",
    "groups a list of words by their first letter",
    "returns the n-th row of Pascal's triangle",
    "removes all whitespace from a string",
    "checks whether brackets in a string are balanced",
    "computes the dot product of two vectors",
    "reads a CSV file and returns its rows as dictionaries",
    "returns the k most common elements of a list",
)
CODE_TEMPLATES = (
    "Write a Python function that {task}.",
    "Write a short Python program that {task}, with a docstring.",
    "Show me a JavaScript function that {task}.",
)

SHORT_QUESTIONS = (
    "What is the capital of Canada?",
    "What is the capital of Japan?",
    "What is the capital of Brazil?",
    "What is the capital of Egypt?",
    "What is the largest planet in the solar system?",
    "How many legs does a spider have?",
    "What is the boiling point of water in Fahrenheit?",
    "Who wrote Romeo and Juliet?",
    "What is the chemical symbol for gold?",
    "How many days are there in a leap year?",
    "What is the square root of 144?",
    "Which ocean is the largest?",
    "What language is spoken in Brazil?",
    "What is the freezing point of water in Celsius?",
    "How many minutes are in a day?",
    "What gas do plants absorb from the air?",
    "What is the longest river in Africa?",
    "Who painted the Mona Lisa?",
    "What is the smallest prime number?",
    "How many sides does a hexagon have?",
    "What is the main ingredient of guacamole?",
    "What is the hardest natural substance?",
    "Which planet is known as the Red Planet?",
    "What is 15 multiplied by 12?",
    "In which country are the pyramids of Giza?",
    "What is the currency of the United Kingdom?",
    "How many bones are in the adult human body?",
    "What is the tallest mountain on Earth?",
    "What is the fastest land animal?",
    "What does CPU stand for?",
    "What is the capital of Kenya?",
    "How many strings does a standard guitar have?",
    "What is the opposite of 'ancient'?",
    "Which organ pumps blood through the body?",
    "What is the plural of 'mouse'?",
    "How many hours are in a week?",
    "What is the largest mammal?",
    "Who discovered penicillin?",
    "What is the speed of light in a vacuum, roughly?",
    "What is the capital of Argentina?",
)
SHORT_TEMPLATES = ("{question}", "{question} Answer in one sentence.")

CONCEPTS = (
    "how a rainbow forms",
    "what inflation is",
    "how vaccines work",
    "why we have seasons",
    "what a black hole is",
    "how a computer stores numbers in binary",
    "what recursion is in programming",
    "how the heart pumps blood",
    "why leaves change colour in autumn",
    "what gravity is",
    "how a bill becomes a law",
    "what machine learning is",
    "how tides are caused by the moon",
    "what an electric circuit is",
    "why the ocean is salty",
    "how bees make honey",
    "what a hash table is",
    "how the internet sends data in packets",
    "what supply and demand means",
    "why exercise is good for health",
    "how a refrigerator keeps food cold",
    "what DNA does in a cell",
    "how volcanoes erupt",
    "what compound interest is",
    "why cats purr",
    "how an airplane stays in the air",
    "what a prime number is",
    "how clouds form",
    "what the greenhouse effect is",
    "how sound travels",
)
EXPLAIN_TEMPLATES = (
    "Explain {concept}.",
    "Explain in simple words {concept}.",
    "Can you explain to a ten-year-old {concept}?",
)

LIST_SUBJECTS = (
    "vegetables that grow well in a small garden",
    "tips for studying effectively",
    "famous scientists and what they discovered",
    "ways to save energy at home",
    "programming languages and what they are used for",
    "healthy breakfast ideas",
    "countries in South America",
    "benefits of reading books",
    "things to pack for a camping trip",
    "common mistakes beginners make in Python",
    "musical instruments in an orchestra",
    "ways to reduce stress",
    "animals that live in the Arctic",
    "board games for families",
    "uses of a spreadsheet",
    "safety rules in a chemistry lab",
    "sources of renewable energy",
    "habits of productive people",
    "parts of a flower",
    "questions to ask in a job interview",
    "planets in the solar system",
    "ingredients for a simple pancake recipe",
    "ways to learn a new language",
    "features of a good password",
    "sports played at the Olympics",
)
LIST_TEMPLATES = (
    "List five {subject}.",
    "Give me a short list of {subject}.",
    "Name three {subject}, with one sentence each.",
)


def _heldout() -> set[str]:
    if not HELDOUT.is_file():
        return set()
    lines = HELDOUT.read_text(encoding="utf-8").splitlines()
    return {json.loads(line)["prompt"].strip() for line in lines if line.strip()}


def training_prompts() -> list[str]:
    """All training prompts (about 500), the four kinds interleaved, none held out."""
    kinds = [
        [t.format(task=task) for task in CODE_TASKS for t in CODE_TEMPLATES],
        [t.format(question=q) for q in SHORT_QUESTIONS for t in SHORT_TEMPLATES],
        [t.format(concept=c) for c in CONCEPTS for t in EXPLAIN_TEMPLATES],
        [t.format(subject=s) for s in LIST_SUBJECTS for t in LIST_TEMPLATES],
    ]
    heldout = _heldout()
    prompts, seen = [], set()
    for index in range(max(len(kind) for kind in kinds)):
        for kind in kinds:
            if index < len(kind) and kind[index] not in heldout and kind[index] not in seen:
                seen.add(kind[index])
                prompts.append(kind[index])
    return prompts
