#!/usr/bin/env python3
"""Checks the documentation (run by `make docs-check`, part of `make test`; standard library only).

1. Every relative link in README.md, docs/*.md and bench/gpu-runs/README.md resolves to a file or
   folder of the repository, and a `#anchor` to a heading of the target file (GitHub's slugs).
2. No tracked source file cites a document that is not in the repository: the steering repo's
   notes (qwen-models.md, cuda-targets.md, decode-performance.md, style.md, ../shared/...) live in
   docs/ in our own words, so cite docs/<name>.md. A bare name that exists in docs/ is accepted.

Each problem is printed as `file:line: what, fix: ...`; exit status 1 if there is any, else 0.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "bench/gpu-runs/README.md"]
SOURCE = re.compile(r"(\.(rs|cu|cuh|h|py|sh|toml|md)|(^|/)Makefile)$")
# Documents of the steering repository that code once cited, and where their facts live now.
OUTSIDE = {
    "qwen-models.md": "docs/models.md",
    "cuda-targets.md": "docs/dispatch.md",
    "decode-performance.md": "docs/benchmarks.md",
    "fatbin-format.md": "docs/fatbin-format.md",
    "style.md": "(no doc: drop the citation)",
}
CITE = re.compile(r"(\.\./)*shared/docs/[\w.-]+|(?<![\w/.-])(docs/)?(" + "|".join(map(re.escape, OUTSIDE)) + r")")
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def tracked():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split("\0") if p]


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen, fence = set(), {}, False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.lstrip().startswith("```"):
                    fence = not fence
                    continue
                m = None if fence else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    base = slug(re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)))
                    n = seen.get(base, 0)
                    seen[base] = n + 1
                    found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def check_links(doc, problems):
    path = os.path.join(ROOT, doc)
    fence = False
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fence = not fence
            if fence:
                continue
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                rel = os.path.relpath(dest, ROOT)
                if rel.startswith(".."):
                    problems.append(f"{doc}:{no}: link `{target}` leaves the repository; fix: link a file inside it")
                elif not os.path.exists(dest):
                    problems.append(f"{doc}:{no}: link `{target}`: no file {rel}; fix: correct the path or add the file")
                elif anchor and os.path.isfile(dest) and dest.endswith(".md") and anchor not in anchors(dest):
                    problems.append(
                        f"{doc}:{no}: link `{target}`: {rel} has no heading with anchor #{anchor}; "
                        f"fix: use one of #{', #'.join(sorted(anchors(dest))[:8])}{' ...' if len(anchors(dest)) > 8 else ''}")


def check_citations(files, problems):
    present = set(os.listdir(os.path.join(ROOT, "docs"))) if os.path.isdir(os.path.join(ROOT, "docs")) else set()
    for rel in files:
        if not SOURCE.search(rel) or rel.startswith("bench/gpu-runs/") or rel == "scripts/check-docs.py":
            continue
        try:
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                lines = f.readlines()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for no, line in enumerate(lines, 1):
            for m in CITE.finditer(line):
                text = m.group(0)
                name = os.path.basename(text)
                if m.group(3) and name in present:
                    continue  # docs/<name>.md, or a bare name that docs/ holds
                fix = f"cite {OUTSIDE.get(name, 'a document in docs/')}"
                problems.append(f"{rel}:{no}: cites `{text}`, which is not in this repository; fix: {fix}")


def main():
    files = tracked()
    docs_dir = os.path.join(ROOT, "docs")
    docs = DOCS + sorted("docs/" + p for p in os.listdir(docs_dir) if p.endswith(".md")) if os.path.isdir(docs_dir) else list(DOCS)
    docs += [p for p in sys.argv[1:] if p not in docs]
    problems = []
    for doc in docs:
        if os.path.exists(os.path.join(ROOT, doc)):
            check_links(doc, problems)
    check_citations(files, problems)
    for p in problems:
        print(p)
    print(f"check-docs: {len(docs)} documents, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
