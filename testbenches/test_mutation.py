"""The mutation tool's mutant generator (testbenches/mutation.py): which single-line changes it makes."""
from pathlib import Path

from testbenches.mutation import (BLOCKS, block_fingerprint, compiler_cache, identities, lines_arg, mutants_of, open_lock, record_status,
                                  statement_spans, swap_mux)
from golden.paths import PROJECT_ROOT


def test_swap_mux_swaps_top_level_arms_only():
    assert swap_mux("x = Mux(a > b, f(c, d), e) + 1") == ["x = Mux(a > b, e, f(c, d)) + 1"]
    assert swap_mux("y = Mux(s, 1, 2)") == ["y = Mux(s, 2, 1)"]
    assert swap_mux("z = a + b") == []


def test_mutants_cover_every_operator_on_code_lines_only(tmp_path):
    src = tmp_path / "block.py"
    src.write_text(
        "def helper(x):\n"
        "    \"\"\"A docstring with 5 == 6.\"\"\"\n"
        "    return x == 1\n"
        "class B:\n"
        "    def elaborate(self, platform):\n"
        "        # a comment with 3 == 4\n"
        "        def inner(v):\n"
        "            return v\n"
        "        s = Signal(4, name=\"s8\")\n"
        "        m.d.sync += s.eq(Mux(a & b, s + 1, 0))\n"
        "        with m.If(s >= 2):\n"
        "            pass\n")
    muts = mutants_of(src, "block.py")
    ops = {m.operator for m in muts}
    assert ops == {"compare", "constant+1", "constant-1", "and/or", "mux arms", "drop register"}
    assert {m.line for m in muts} == {3, 9, 10, 11}   # not the docstring or the comment; past a nested def
    assert not any("s9" in m.after or "s7" in m.after for m in muts)   # names in strings untouched
    assert any(m.after == "with m.If(s < 2):" for m in muts)
    assert any(m.after == "m.d.comb += s.eq(Mux(a & b, s + 1, 0))" for m in muts)
    # only the lines the block's elaboration ran, when given
    assert {m.line for m in mutants_of(src, "block.py", run={10, 11})} == {10, 11}


def test_a_statement_over_several_lines_is_one_span(tmp_path):
    src = tmp_path / "block.py"
    src.write_text("def f(m):\n"
                   "    m.d.sync += [a.eq(1),\n"
                   "                 b.eq(2)]\n"
                   "    with m.If(c == 0):\n"
                   "        pass\n")
    spans = statement_spans(src)
    assert range(2, 4) in spans and range(4, 5) in spans   # the with's header only, not its body


def test_identities_keep_identical_lines_apart_and_survive_moved_lines():
    def mutant(line, before="c.eq(c + 1)", after="c.eq(c + 2)"):
        return {"file": "b.py", "line": line, "before": before, "after": after}
    run = [mutant(20), mutant(9), mutant(12, "x", "y")]    # one update in two states, out of order
    moved = [mutant(11), mutant(22), mutant(14, "x", "y")]  # the same mutants, two lines further down
    assert len(set(identities(run))) == 3
    assert identities(moved) == [identities(run)[j] for j in (1, 0, 2)]
    assert identities(run, sampled=3)[0] == ("b.py", "c.eq(c + 1)", "c.eq(c + 2)", 20)   # a sample keeps its lines


def test_every_block_names_existing_sources_and_tests():
    for block, (sources, tests) in BLOCKS.items():
        assert all((PROJECT_ROOT / s).is_file() for s in sources), block
        assert (PROJECT_ROOT / tests[0]).is_file(), block
        has_mutants = bool(mutants_of(PROJECT_ROOT / sources[0], sources[0]))
        assert has_mutants == (block != "mac-unit"), block   # mac-unit's own lines only connect its parts


def test_attribute_only_changes_are_told_apart():
    """A mutant that changes only ``(* ... *)`` attributes (synthesis directives) is equivalent in
    simulation; one that changes a width is not."""
    from testbenches.mutation import without_attributes
    a = '(* src = "x.py:1" *)\n(* COLLISION_X = 1 *)\nreg [3:0] mem [0:7];\n'
    b = a.replace("COLLISION_X = 1", "COLLISION_X = 2")
    c = a.replace("[3:0]", "[4:0]")
    assert without_attributes(a) == without_attributes(b) and a != b
    assert without_attributes(a) != without_attributes(c)


def test_a_block_depends_on_the_golden_models_its_bench_and_sources_import():
    from testbenches.mutation import block_fingerprint
    from testbenches.runner import bench_sources, imported_sources
    sources = bench_sources("mac-match", "hdl.mac.match")
    # followed through relative imports: mac_unit -> .sfm, .fixedpoint
    assert {"testbenches/tb/tb_mac_match.py", "golden/mac_unit.py", "golden/sfm.py", "golden/fixedpoint.py",
            "testbenches/streams.py"} <= set(sources)
    assert "golden/lad_tile.py" not in sources and not any(s.startswith("golden/attncache") for s in sources)
    assert [s for s in sources if s.startswith("hdl/")] == ["hdl/mac/match.py"]   # the root; hdl not followed
    # a mutant's outcome also depends on the RTL its block instantiates: relative imports inside hdl
    rtl = imported_sources(["hdl.lad.eas"], ("hdl", "golden"))
    assert {"hdl/lib/sram.py", "hdl/lib/vpu.py", "hdl/lad/common.py", "golden/lad_tile.py"} <= set(rtl)
    assert len(block_fingerprint("mac-match")) == 16


def test_compare_verilog_tells_same_from_differs_and_leaves_no_mutant_verilog(tmp_path):
    """In a copy: the unmutated sources are ``same``; a narrowed register ``differs`` (the smallest
    preset compared first, the texts left in the copy's Verilog cache for the tests); the mutant's
    cached Verilog is removed with its builds."""
    from testbenches.mutation import compare_verilog, copy_repository, drop_new_builds, mutants_of, mutated, verilog_of
    work = tmp_path / "repo"
    copy_repository(work)
    ok, original = verilog_of(work, "sram")
    assert ok and len(original) >= 2 and all("module top" in v for v in original)
    (work / "build" / "sim").mkdir(parents=True)
    for n, text in enumerate(original):
        (work / "build" / f"original{n}.v").write_text(text)
    (work / "build" / "BASELINE").write_text("")
    assert compare_verilog(work, "sram", timeout=300) == "same"
    drop_new_builds(work)
    source = work / "hdl/lib/sram.py"
    drop = next(m for m in mutants_of(source, "hdl/lib/sram.py") if m.operator == "drop register")
    source.write_text(mutated(source.read_text(), drop))
    assert compare_verilog(work, "sram", timeout=300) == "differs"
    cached = list((work / "build" / "verilog-cache").glob("*.v"))
    assert cached and any(c.read_text() not in original for c in cached)   # up to the first that differs
    drop_new_builds(work)
    assert not list((work / "build" / "verilog-cache").glob("*.v"))


def test_the_compiler_cache_serves_a_second_compile_of_the_same_source(tmp_path):
    """compiler_cache: ccache (the test extra) in front of the compiler, its cache in the folder
    given: the second compile of an unchanged source is a hit, a changed one a miss."""
    import os
    import subprocess
    env = {**os.environ, **compiler_cache(tmp_path)}
    assert "OBJCACHE=" in env["MAKEFLAGS"] and env["CCACHE_DIR"] == str(tmp_path / "ccache")
    ccache = env["MAKEFLAGS"].split("OBJCACHE=")[1].split()[0]
    src = tmp_path / "a.cpp"
    for n, body in enumerate(["return x * 3;", "return x * 3;", "return x * 4;"]):
        src.write_text(f"int f(int x) {{ {body} }}\n")
        subprocess.run([ccache, "c++", "-O1", "-c", str(src), "-o", str(tmp_path / f"{n}.o")], env=env, check=True)
    stats = dict(line.split("\t") for line in subprocess.run(
        [ccache, "--print-stats"], env=env, capture_output=True, text=True, check=True).stdout.splitlines())
    assert int(stats["direct_cache_hit"]) == 1 and int(stats["cache_miss"]) == 2


def test_lines_name_a_file_by_the_end_of_its_path_and_a_line():
    """--lines FILE:LINE,...: pairs in order; anything else is the one-line usage error (exit 2)."""
    import argparse
    import pytest
    assert lines_arg("ac.py:542,hdl/lib/pipe.py:7") == [("ac.py", 542), ("hdl/lib/pipe.py", 7)]
    for bad in ("ac.py", "ac.py:x", "ac.py:5,"):
        with pytest.raises(argparse.ArgumentTypeError):
            lines_arg(bad)


def test_one_run_of_a_block_at_a_time(tmp_path):
    """A second run of a block would re-copy the first's repository copies under it: its lock is
    refused while the first holds it, and free once the first has let go."""
    first = open_lock(tmp_path / "RUNNING")
    assert first is not None and open_lock(tmp_path / "RUNNING") is None
    first.close()
    assert open_lock(tmp_path / "RUNNING") is not None


def test_status_tells_a_current_record_from_one_of_other_sources(tmp_path, monkeypatch):
    """--status: a record with the block's fingerprint is current; one of other sources and benches,
    with no commit to compare against, counts its sources as changed (a re-run owed)."""
    import json
    from testbenches import mutation
    monkeypatch.setattr(mutation, "RESULTS", tmp_path)
    assert record_status("sram")["status"] == "no record"
    record = {"block": "sram", "mutants_total": 4, "fingerprint": block_fingerprint("sram"),
              "counts": {"killed": 2, "killed (elaboration)": 1, "survived": 1, "equivalent": 1,
                         "equivalent (attributes only)": 1}, "mutants": []}
    (tmp_path / "mutation-sram-now.json").write_text(json.dumps(record))
    now = record_status("sram")
    assert now["status"] == "current" and (now["killed"], now["survived"], now["equivalent"], now["score"]) == (3, 1, 2, 0.75)
    (tmp_path / "mutation-sram-now.json").write_text(json.dumps({**record, "fingerprint": "0" * 16}))
    assert record_status("sram")["status"].startswith("RTL changed (hdl/lib/sram.py")
