"""What the launcher ships with rank code: the notebook cells' lines of every function it
runs, also those reached through a wrapper (record.traced) or passed as an argument."""

import linecache

from distopt.engine import record, shipping


def _cell(name: str, source: str) -> dict:
    """A function defined in a pretend notebook cell (a file name only linecache knows)."""
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    namespace: dict = {}
    exec(compile(source, name, "exec"), namespace)
    return namespace


def test_cells_behind_a_wrapper_and_in_the_arguments_are_shipped():
    rank_code = _cell("<cell-rank>", "def rank_code(rank, world_size, server):\n    return rank\n")
    server = _cell("<cell-server>", "def server(x):\n    return x\n")
    traced = record.traced(rank_code["rank_code"])
    assert set(shipping.cell_sources(traced)) == {"<cell-rank>"}
    found = shipping.cell_sources((traced, server["server"]))
    assert set(found) == {"<cell-rank>", "<cell-server>"}
    assert found["<cell-server>"] == ["def server(x):\n", "    return x\n"]
