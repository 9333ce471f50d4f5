"""Reasoning tasks generated here, for long free-running generations: word problems, their prompt, their scoring.

word_problems.py draws the problems (GSM-Symbolic style), prompts.py frames them few-shot in the chat template,
answers.py reads the final number as lm-evaluation-harness's gsm8k task does. The runner is measure/reasoning.py.
"""
