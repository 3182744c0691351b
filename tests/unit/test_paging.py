"""Pages of a named list (delta_log.core.paging): GET /topics and GET /groups."""

from delta_log.core.paging import page_of


def test_pages_of_a_named_list():
    names = ["b", "a", "Ab", "c", "ab-2"]
    assert page_of(names, str) == (sorted(names), None)
    assert page_of(names, str, limit=2) == (["Ab", "a"], "a")
    assert page_of(names, str, after="a", limit=2) == (["ab-2", "b"], "b")
    assert page_of(names, str, after="b", limit=2) == (["c"], None)
    assert page_of(names, str, search="AB") == (["Ab", "ab-2"], None)


def test_the_costly_check_is_asked_only_of_the_page():
    asked = []

    def keep(n):
        asked.append(n)
        return n != "c"  # "c" is not one (a half-deleted topic's folder)

    names = [f"{x}" for x in "abcdefgh"]
    assert page_of(names, str, limit=3, keep=keep) == (["a", "b", "d"], "d")
    assert asked == ["a", "b", "c", "d", "e"]  # one past the page, to know whether more follow
    assert page_of(names, str, after="f", limit=3, keep=keep) == (["g", "h"], None)
