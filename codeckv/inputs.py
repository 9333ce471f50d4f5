"""What users and API callers hand the app, read and checked at the edge: documents and text files.

    text = read_text_file("notes.md")               # UTF-8, bounded, or a ValueError saying what is wrong
    text = document_text("Python reference: the try statement")   # an embedded long document
"""

from __future__ import annotations

from pathlib import Path
from pydoc_data.topics import topics

MAX_TEXT_CHARS = 200_000  # an uploaded or pasted text (the embedded model's 8k-token context is ~35k characters)
TEXT_FILE_TYPES = (".txt", ".md")

DOCUMENTS = {  # title -> key of an embedded Python reference topic of 1-3k tokens (the corpus, measure/corpus.py)
    "Python reference: the try statement (≈2.0k tokens)": "try",
    "Python reference: the import system (≈2.1k tokens)": "import",
    "Python reference: execution model (≈2.2k tokens)": "execmodel",
    "Python reference: function definitions (≈1.5k tokens)": "function",
}


def document_text(title: str) -> str:
    """The text of an embedded document, or a ValueError listing the titles."""
    if title not in DOCUMENTS:
        raise ValueError(f"unknown document {title!r} (allowed: {', '.join(DOCUMENTS)})")
    return topics[DOCUMENTS[title]]


def with_document(message: str, title: str | None = None, path: str | Path | None = None) -> tuple[str, str]:
    """(what the model reads, what the chat shows): an uploaded file or an embedded document, then the message."""
    if path:
        text, name = read_text_file(path), Path(path).name
    elif title:
        text, name = document_text(title), title
    else:
        return message, message
    return f"{text.strip()}\n\n{message}", f"[document: {name}, {len(text):,} characters]\n\n{message}"


def read_text_file(path: str | Path, max_chars: int = MAX_TEXT_CHARS) -> str:
    """A .txt / .md file as text: UTF-8, at most max_chars characters, else a ValueError that says why."""
    path = Path(path)
    if path.suffix.lower() not in TEXT_FILE_TYPES:
        raise ValueError(f"{path.name}: only text files can be read (allowed: {', '.join(TEXT_FILE_TYPES)})")
    if path.stat().st_size > 4 * max_chars:  # a UTF-8 character takes at most 4 bytes
        raise ValueError(f"{path.name} has more than {max_chars:,} characters: use a shorter text")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path.name} is not UTF-8 text (byte {err.start} cannot be decoded)") from None
    if len(text) > max_chars:
        raise ValueError(f"{path.name} has more than {max_chars:,} characters: use a shorter text")
    return text
