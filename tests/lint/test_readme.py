"""The README stays a newcomer's read (under 300 lines; the rest lives in docs/), and every
relative link in it and in docs/ points at a file that exists, and at a heading that exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_is_under_300_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) < 300


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
                if anchor not in headings:
                    broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken
