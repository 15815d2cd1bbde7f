"""The text of a chain's cut (context management, c2/rl/episodes.py): the note that asks for a
summary, and the user turn that opens the next segment. Here, with the environments, because the
notes tasks' oracle chains (c2/envs/notes.py, SFT data) must render them exactly as RL plays them.
"""

# Short on purpose: with byte tokens every character is a token of the context the chain saves.
SUMMARY_INSTRUCTION = (
    "Your context is nearly full. Summarise your progress: exact values found, changes made, "
    "what is left. No tool call."
)
SUMMARY_HEADER = "Your summary (context reset; files are as you left them):"


def segment_head(instruction: str) -> str:
    """The user turn that opens a chain's next segment, before the summary: the task, then the
    header (agent SFT data renders it with this too, so both token streams are the same)."""
    return f"{instruction.rstrip()}\n\n{SUMMARY_HEADER}\n"
