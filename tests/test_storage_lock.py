"""The study lock never follows a symlink or writes through anything that is not a regular file (issue 14)."""

import os

import pytest

from bayes_safe.tuning.storage import study_lock


def test_symlinked_lock_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "important.txt"
    victim.write_text("keep me\n")
    db = tmp_path / "study.sqlite"
    (tmp_path / "study.sqlite.lock").symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"), study_lock(f"sqlite:///{db}"):
        pass
    assert victim.read_text() == "keep me\n"


def test_a_lock_that_is_not_a_regular_file_is_refused(tmp_path):
    db = tmp_path / "study.sqlite"
    os.mkfifo(tmp_path / "study.sqlite.lock")
    with pytest.raises(ValueError, match="not a regular file"), study_lock(f"sqlite:///{db}"):
        pass
    (tmp_path / "study.sqlite.lock").unlink()
    (tmp_path / "study.sqlite.lock").mkdir()
    with pytest.raises(ValueError, match="cannot open the lock"), study_lock(f"sqlite:///{db}"):
        pass


def test_a_stale_regular_lock_is_reused_and_a_held_one_refused(tmp_path):
    db = tmp_path / "study.sqlite"
    (tmp_path / "study.sqlite.lock").write_text('{"pid": 1}')  # left by a dead process
    with study_lock(f"sqlite:///{db}"):
        assert str(os.getpid()) in (tmp_path / "study.sqlite.lock").read_text()
        with pytest.raises(ValueError, match="another process"), study_lock(f"sqlite:///{db}"):
            pass


def test_a_study_killed_mid_write_is_still_read(tmp_path):
    """A SIGKILL inside a write transaction leaves a hot journal; reading the study rolls it back
    (read-only opening cannot), so resume after such a crash works and sees the committed rows."""
    import signal
    import sqlite3
    import subprocess
    import sys

    from bayes_safe.tuning.storage import EXPERIMENT_TABLE, _read_sqlite

    db = tmp_path / "study.sqlite"
    conn = sqlite3.connect(db)
    conn.execute(f"CREATE TABLE {EXPERIMENT_TABLE} (name TEXT, properties TEXT)")
    conn.execute(f"INSERT INTO {EXPERIMENT_TABLE} VALUES ('kept', '{{}}')")
    conn.commit()
    conn.close()
    writer = (
        "import os, signal, sqlite3\n"
        f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "c.execute('PRAGMA cache_size=1'); c.execute('BEGIN')\n"
        f"for i in range(20000): c.execute(\"INSERT INTO {EXPERIMENT_TABLE} VALUES ('lost' || ?, '{{}}')\", (i,))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", writer], check=False, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "study.sqlite-journal").stat().st_size > 0, "no hot journal: the scenario did not happen"
    assert _read_sqlite(db, "storage") == [("kept", "{}")]
