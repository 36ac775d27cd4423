"""What the exercise checks' tests share: a check must refuse an answer and say why."""


def refused(check, fn, capsys, *expected: str) -> str:
    """Run ``check(fn)``, require it to refuse ``fn`` with every text of ``expected`` in what it
    printed, and return the printed verdict."""
    assert not check(fn), f"{check.__name__} passed a wrong answer"
    out = capsys.readouterr().out
    assert "✗" in out, out
    for text in expected:
        assert text in out, out
    return out
