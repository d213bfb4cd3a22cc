"""How the README's blocks are read: the parser the README test runs on, on small made-up READMEs."""
from readme_blocks import blocks, differences, excerpt_problems, matches


def test_blocks_are_read_by_language_and_mark():
    text = "\n".join([
        "# t", "```", "make demo   # the main job", "make test", "```",
        "## Quick start", "```", "$ edgetrain compile m --out b", "a 1", "", "$ edgetrain run b", "```",
        "<!-- file: mynet.py -->", "```python", "x = 1", "```",
        "```python", "print(2)", "```",
        "<!-- excerpt: b/plan.py -->", "```python", "relu = rt.call(x)", "...", "```",
        "<!-- not run: installs into your own environment -->", "```", "pip install -e .", "```",
        "```text", "a -> b", "```"])
    bs = blocks(text)
    assert [b.kind for b in bs] == ["shell", "shell", "file", "script", "excerpt", "not run", "picture"]
    assert [c.line for c in bs[0].commands] == ["make demo", "make test"] and bs[0].commands[0].shown is None
    assert [(c.line, c.shown) for c in bs[1].commands] == [("edgetrain compile m --out b", ["a 1"]),
                                                            ("edgetrain run b", [])]
    assert bs[2].mark == ("file", "mynet.py") and bs[2].section == "Quick start"


def test_numbers_are_masked_and_dots_stand_for_lines():
    shown = ["budget 0.718 MB (smallest feasible 0.640 MB)", "┃ stage ┃ node   ┃"]
    assert matches(shown, ["budget 12.5 MB (smallest feasible 3 MB)", "┃ stage ┃ node      ┃"])
    assert not matches(shown, ["budget 1 MB (least feasible 3 MB)", shown[1]])
    assert matches(["a", "...", "z"], ["a", "b", "c", "z"]) and matches(["a", "...", "z"], ["a", "z"])
    assert not matches(["a", "...", "z"], ["a", "b"])
    assert differences(shown, shown[:1]) == ["README shows 2 lines, the command printed 1"]


def test_an_excerpt_must_be_in_the_file():
    assert excerpt_problems("a = 1\n...\nb = 2\n", "a = 3\nc\nb = 2\n") == []
    assert excerpt_problems("a = f(x)\n", "a = g(x)\n") == ["a = f(x)"]
