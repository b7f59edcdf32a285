"""constants.npz written aligned and read in place (ollie.program.constants_file)."""

from __future__ import annotations

import mmap
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ollie.program import constants_file
from ollie.program.serialize import FormatError

DTYPES = st.sampled_from([np.float32, np.float64, np.int64, np.int32, np.int8, np.uint8,
                          np.bool_, np.float16])
ARRAYS = DTYPES.flatmap(lambda d: hnp.arrays(d, hnp.array_shapes(min_dims=0, max_dims=4,
                                                                  min_side=0, max_side=5)))
NAMES = st.text("abcxyz_0123456789", min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(consts=st.dictionaries(NAMES, ARRAYS, max_size=6))
def test_round_trip_is_exact_aligned_and_numpy_reads_it(tmp_path_factory, consts) -> None:
    path = tmp_path_factory.mktemp("c") / "constants.npz"
    constants_file.save(path, consts)
    got = constants_file.load(path)
    assert list(got) == list(consts)
    with np.load(path, allow_pickle=False) as z:  # still numpy's own format
        assert sorted(z.files) == sorted(consts)
        for n, a in consts.items():
            np.testing.assert_array_equal(z[n], a)
    for n, a in consts.items():
        assert got[n].dtype == a.dtype and got[n].shape == a.shape
        np.testing.assert_array_equal(got[n], a)
        assert got[n].flags.writeable
        if a.size:
            assert got[n].ctypes.data % constants_file.ALIGN == 0


def test_names_numpy_savez_cannot_take_and_fortran_order(tmp_path) -> None:
    consts = {"file": np.arange(6, dtype=np.float32),
              "allow_pickle": np.asfortranarray(np.arange(12.0).reshape(3, 4))}
    constants_file.save(tmp_path / "c.npz", consts)
    got = constants_file.load(tmp_path / "c.npz")
    for n, a in consts.items():
        np.testing.assert_array_equal(got[n], a)
    assert got["allow_pickle"].flags.f_contiguous


def test_a_file_numpy_wrote_loads_with_every_array_aligned(tmp_path) -> None:
    consts = {"w" + "x" * i: np.random.default_rng(i).standard_normal(7 + i).astype(np.float32)
              for i in range(5)}  # names of every length mod 4: some data unaligned in the file
    np.savez(tmp_path / "c.npz", **consts)
    got = constants_file.load(tmp_path / "c.npz")
    for n, a in consts.items():
        np.testing.assert_array_equal(got[n], a)
        assert got[n].ctypes.data % got[n].dtype.alignment == 0
    in_place = [isinstance(a.base, mmap.mmap) for a in got.values()]
    assert any(in_place) and not all(in_place)  # both paths: viewed in place and copied out


def test_writes_to_a_loaded_array_never_reach_the_file(tmp_path) -> None:
    path = tmp_path / "c.npz"
    constants_file.save(path, {"w": np.ones(1000, np.float32)})
    got = constants_file.load(path)
    got["w"][:] = 5.0
    np.testing.assert_array_equal(constants_file.load(path)["w"], np.ones(1000, np.float32))


def test_saving_over_a_loaded_file_leaves_the_loaded_arrays_whole(tmp_path) -> None:
    path = tmp_path / "c.npz"
    constants_file.save(path, {"w": np.full(50_000, 2.0, np.float32)})
    old = constants_file.load(path)
    constants_file.save(path, {"v": np.zeros(10, np.int64)})
    np.testing.assert_array_equal(old["w"], np.full(50_000, 2.0, np.float32))
    assert list(constants_file.load(path)) == ["v"]
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]  # no temporary file left


def test_a_flipped_data_byte_is_caught_by_the_crc(tmp_path) -> None:
    path = tmp_path / "c.npz"
    constants_file.save(path, {"w": np.arange(100, dtype=np.float32)})
    raw = bytearray(path.read_bytes())
    at = raw.rindex(np.arange(100, dtype=np.float32).tobytes()) + 40
    raw[at] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=r"member 'w\.npy'.*CRC"):
        constants_file.load(path)


@pytest.mark.parametrize("write, match", [
    (lambda p: np.savez(p, w=np.array([{"a": 1}], dtype=object)), "element type object"),
    (lambda p: np.savez_compressed(p, w=np.ones(3)), "compressed"),
    (lambda p: zipfile.ZipFile(p, "w").writestr("notes.txt", "hi"), "not a .npy array"),
    (lambda p: zipfile.ZipFile(p, "w").writestr("w.npy", "\x93NUMPY garbage"),
     "not a .npy array"),
    (lambda p: p.write_bytes(b"PK\x03\x04 not a zip"), "not a valid constants archive"),
])
def test_malformed_archives_raise_format_error_naming_the_file(tmp_path, write, match) -> None:
    path = tmp_path / "c.npz"
    write(path)
    with pytest.raises(FormatError, match=match) as e:
        constants_file.load(path)
    assert "c.npz" in str(e.value)


def test_a_truncated_archive_is_refused(tmp_path) -> None:
    path = tmp_path / "c.npz"
    constants_file.save(path, {"w": np.arange(1000, dtype=np.float32)})
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(FormatError):
        constants_file.load(path)
