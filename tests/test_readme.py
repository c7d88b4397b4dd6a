"""The README as a product page: short, its quick-start test command the one CI runs, and every
link in it, the docs and the method pages pointing at a file of the repository."""

import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [
    "README.md",
    *sorted(glob.glob("docs/*.md", root_dir=REPO)),
    *sorted(glob.glob("rubric_rl/methods/*/README.md", root_dir=REPO)),
]


def _read(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return f.read()


def _quick_start_commands():
    text = _read("README.md")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_readme_is_short():
    assert len(_read("README.md").splitlines()) <= 300


def test_quick_start_is_two_commands_and_the_tests_are_cis():
    run, tests = _quick_start_commands()
    assert run.startswith("python3 -m venv .venv") and "python -m rubric_rl.launch" in run
    assert tests.startswith("python3 -m venv .venv") and "pip install -e '.[test]'" in tests
    # .ci/run ends with the README's test command (after its own venv and installs).
    ci = [ln for ln in _read(".ci/run").splitlines() if ln.startswith("python -m pytest")]
    assert ci and tests.endswith(" && " + ci[-1])


def test_links_resolve_and_pages_carry_no_issue_numbers_or_hashes():
    for page in PAGES:
        text = _read(page)
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path = os.path.normpath(os.path.join(REPO, os.path.dirname(page), target))
            assert os.path.exists(path), f"{page}: link {target} names no file"
        assert not re.search(r"\b[Ii]ssue \d+", text), f"{page}: names an issue number"
        outside = re.search(
            r"\.\./shared|(?<![\w/])(?:shared|notes)/\w|\b\d{3}_[0-9a-f]{16}\.txt", text
        )
        assert not outside, f"{page}: names a file outside the repository ({outside.group(0)})"
        assert not re.search(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text), (
            f"{page}: carries a commit hash"
        )
