"""Root attributes of the HDF5 logs: text from outside (the MPI library's version string,
host names) is cleaned to what HDF5 stores, and a value it cannot store is refused by
name before the file is written."""

from __future__ import annotations

import h5py
import pytest

from pal_hpc.io.attrs import attr_value, clean_text
from pal_hpc.io.metrics import MetricsLog, read_metrics
from pal_hpc.io.provenance import run_attributes

# What Open MPI 5.0's MPI_Get_library_version gives (the NUL is part of the string
# mpi4py returns), and MPICH's several lines.
OPEN_MPI = ("Open MPI v5.0.11, package: Open MPI runner@host Distribution, ident: 5.0.11, "
            "repo rev: v5.0.11, Feb 02, 2026\x00")
MPICH = "MPICH Version:      5.0.2\nMPICH Release date: unreleased\nMPICH ABI:   17:2:5\n"


def test_clean_text_drops_nul_controls_and_surrogates_keeps_lines():
    assert clean_text(OPEN_MPI) == OPEN_MPI[:-1]
    assert clean_text(MPICH) == MPICH.rstrip()
    assert clean_text("a\x00b\x07c\x1b[0m\td\r\n") == "abc[0m\td"
    assert clean_text("node-\udcff7") == "node-7"            # undecodable host-name byte
    assert clean_text("Intel(R) MPI Library 2021.19 für Linux*") == \
        "Intel(R) MPI Library 2021.19 für Linux*"


def test_open_mpi_version_string_is_stored_and_read_back(tmp_path):
    """The start-up crash of issue 19: Open MPI's version string as the mpi_library
    attribute."""
    path = tmp_path / "metrics.h5"
    attrs = run_attributes({"algo": "dqn"}, {"ranks": 4}, ["n1", "bad-\udcffhost"], OPEN_MPI)
    with MetricsLog(path, attrs):
        pass
    back = read_metrics(path)["attrs"]
    assert back["mpi_library"] == OPEN_MPI.rstrip("\x00")
    assert back["hosts"] == ["n1", "bad-host"]
    with h5py.File(path, "r") as f:
        assert "\x00" not in f.attrs["mpi_library"]


@pytest.mark.parametrize("value, error, words", [
    ("v5\x00", ValueError, "holds a NUL character"),
    ("host-\udcff", ValueError, "is not valid UTF-8"),
    (2 ** 63, ValueError, "beyond int64"),
    (object(), TypeError, "cannot store a object"),
    ({"set": {1, 2}}, TypeError, "cannot store it as JSON"),
])
def test_a_value_hdf5_cannot_store_is_refused_by_name_before_the_file(tmp_path, value,
                                                                      error, words):
    path = tmp_path / "metrics.h5"
    with pytest.raises(error) as exc:
        MetricsLog(path, {"config": {"lr": 1.0}, "mpi_library": value})
    assert "metrics attribute 'mpi_library'" in str(exc.value) and words in str(exc.value)
    assert not path.exists()                                 # nothing half-written


def test_containers_escape_what_a_string_cannot_hold():
    """JSON escapes a NUL or a surrogate inside a dict or list: storable as it is."""
    stored = attr_value("config", {"note": "a\x00b", "host": "\udcff"})
    assert "\x00" not in stored and stored.encode("utf-8")
    assert attr_value("seed", 7) == 7 and attr_value("ok", True) is True
    assert attr_value("note", None) == ""
