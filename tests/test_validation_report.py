"""docs/validation.md's renderer on made-up results: nothing is run here."""
import json

from torchtpu._validate import report
from torchtpu._validate.runner import COMPILED, MODES


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _eager(mid, status):
    return {"id": mid, "status": status, "modes": {m: {"status": status, "cause": None if status == "pass" else "mismatch",
                                                      "detail": "max err 1"} for m in MODES}}


def _compiled(mid, status):
    return {"id": mid, "status": status,
            "modes": {COMPILED: {"status": status, "cause": None if status == "pass" else "exception",
                                 "detail": "boom"}}}


def test_compiled_run_without_eager_results_replaces_only_the_compiled_section(tmp_path):
    eager, compiled, out = tmp_path / "results.jsonl", tmp_path / "compiled.jsonl", tmp_path / "v.md"
    _write(eager, [_eager("hf/a/A", "pass"), _eager("timm/b", "fail")])
    _write(compiled, [_compiled("hf/a/A", "pass")])
    report.render(str(eager), str(out), enumerated={}, compiled_path=str(compiled))
    first = out.read_text()
    assert report.COMPILED_HEADING in first and "timm/b" in first
    head, rest = first.split(report.COMPILED_HEADING)
    tail = rest[rest.index("\n## "):]

    # A fresh checkout: the eager results are gone, a compiled run has new results.
    eager.unlink()
    _write(compiled, [_compiled("hf/a/A", "pass"), _compiled("timm/b", "fail")])
    report.render(str(eager), str(out), enumerated={}, compiled_path=str(compiled))
    second = out.read_text()
    assert second.startswith(head + report.COMPILED_HEADING) and second.endswith(tail)
    section = second[len(head):len(second) - len(tail)]
    assert "| timm/b | forward | exception | boom |" in section
    assert second.count(report.COMPILED_HEADING) == 1


def test_report_without_a_compiled_section_gains_one_before_the_failures(tmp_path):
    eager, compiled, out = tmp_path / "results.jsonl", tmp_path / "compiled.jsonl", tmp_path / "v.md"
    _write(eager, [_eager("hf/a/A", "pass"), _eager("timm/b", "fail")])
    report.render(str(eager), str(out), enumerated={})
    assert report.COMPILED_HEADING not in out.read_text()
    eager.unlink()
    _write(compiled, [_compiled("hf/a/A", "pass")])
    report.render(str(eager), str(out), enumerated={}, compiled_path=str(compiled))
    text = out.read_text()
    assert text.index(report.COMPILED_HEADING) < text.index("## Failures by cause")
