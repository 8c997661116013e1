"""Two threads of one process writing one file at once (the spool's first op, from two tracking
threads, each writing the run directory's mark): neither write fails, the file is one writer's
whole content, and no temporary is left behind."""
import json
import threading

from hindsight.fsutil import TEMPORARY, atomic_write_json, temporary_for
from hindsight.state.rundir import RunDir


def test_threads_writing_one_file_at_once_never_fail(tmp_path):
    path, errors = tmp_path / "mark.json", []
    start = threading.Barrier(4)

    def writer(k: int) -> None:
        start.wait()
        for i in range(200):
            try:
                atomic_write_json(path, {"writer": k, "i": i, "pad": "x" * 4096})
            except Exception as exc:  # noqa: BLE001 - the failure is what the test counts
                errors.append(repr(exc))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(path.read_text())["i"] == 199
    assert [p.name for p in tmp_path.iterdir()] == ["mark.json"]


def test_a_threads_temporary_is_its_own_and_a_dead_ones_is_swept(tmp_path):
    names, alive = [], threading.Barrier(2)

    def name_it() -> None:
        names.append(temporary_for(tmp_path / "f").name)
        alive.wait()  # both alive at once: a finished thread's ident may be handed to the next

    threads = [threading.Thread(target=name_it) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(names)) == 2 and all(TEMPORARY.match(n) for n in names)

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    run.record("rl").mkdir()
    (run.root / "rl" / ".manifest.json.tmp-999999-140000").write_text("{half")  # a killed thread's
    assert [p.name for p in run.sweep_temporaries()] == [".manifest.json.tmp-999999-140000"]
