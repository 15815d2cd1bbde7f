import pytest
from gradebook.ranking import PASS_MARK, Student, pass_rate, passing, rank, top_students


def test_rank_distinct():
    assert rank({"ann": 70, "bob": 90, "cy": 80}) == {"bob": 1, "cy": 2, "ann": 3}


def test_rank_ties_share_and_skip():
    got = rank({"a": 90, "b": 80, "c": 80, "d": 70})
    assert got == {"a": 1, "b": 2, "c": 2, "d": 4}


def test_rank_empty():
    assert rank({}) == {}


def test_top_students_ties_by_name():
    students = [Student("zed", 80), Student("amy", 80), Student("max", 95), Student("lou", 10)]
    assert top_students(students, 3) == ["max", "amy", "zed"]


def test_passing_at_mark():
    students = [Student("a", PASS_MARK), Student("b", PASS_MARK - 1), Student("c", PASS_MARK + 9)]
    assert passing(students) == ["a", "c"]


def test_pass_rate():
    students = [Student("a", PASS_MARK), Student("b", 0), Student("c", 0), Student("d", 100)]
    assert pass_rate(students) == pytest.approx(0.5)


def test_pass_rate_empty():
    assert pass_rate([]) == 0.0
