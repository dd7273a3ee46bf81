"""The seconds of an upload read from its container's header (gateway/audio.py)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthgate.gateway.audio import FALLBACK_BYTES_PER_S, audio_seconds
from tests.unit.test_endpoints import wav


def test_wav_of_any_rate() -> None:
    assert audio_seconds(wav(3.0)) == 3.0
    assert audio_seconds(wav(1.5, rate=44100)) == pytest.approx(1.5)


def test_streamed_wav_counts_what_is_there() -> None:
    data = bytearray(wav(2.0))
    at = data.find(b"data")
    data[at + 4 : at + 8] = struct.pack("<I", 0xFFFFFFFF)  # size unknown when recorded
    assert audio_seconds(bytes(data)) == pytest.approx(2.0)


def test_flac_streaminfo() -> None:
    rate, samples = 16000, 48000
    packed = (rate << 44) | (0 << 41) | (15 << 36) | samples
    info = bytes(10) + packed.to_bytes(8, "big") + bytes(16)
    data = b"fLaC" + b"\x80\x00\x00\x22" + info
    assert audio_seconds(data) == 3.0


def _mp3_frame() -> bytes:
    # sync, MPEG-1 layer III, 128 kbit/s, 44.1 kHz
    return b"\xff\xfb\x90\x00" + bytes(413)


def test_mp3_cbr_from_its_bitrate_and_vbr_from_its_frame_count() -> None:
    frame = _mp3_frame()
    cbr = frame * 100
    assert audio_seconds(cbr) == pytest.approx(len(cbr) * 8 / 128_000)
    xing = bytearray(frame)
    xing[36:48] = b"Xing" + struct.pack(">II", 1, 1000)  # 1,000 frames of 1,152 samples
    assert audio_seconds(bytes(xing) + frame * 10) == pytest.approx(1000 * 1152 / 44100)
    tagged = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10) + cbr
    assert audio_seconds(tagged) == pytest.approx(len(cbr) * 8 / 128_000)


def _ogg_page(granule: int, payload: bytes) -> bytes:
    return b"OggS" + bytes(2) + struct.pack("<q", granule) + bytes(14) + payload


def test_ogg_opus_from_the_last_granule() -> None:
    head = b"OpusHead" + b"\x01\x01" + struct.pack("<H", 312) + bytes(20)
    data = _ogg_page(0, head) + _ogg_page(48000 * 4 + 312, bytes(30))
    assert audio_seconds(data) == pytest.approx(4.0)


def test_mp4_mvhd() -> None:
    mvhd = b"mvhd" + bytes(4) + bytes(8) + struct.pack(">II", 1000, 2500) + bytes(20)
    assert audio_seconds(bytes(8) + mvhd) == 2.5


def test_unknown_containers_are_estimated_from_their_size() -> None:
    webm = b"\x1a\x45\xdf\xa3" + bytes(8000)
    assert audio_seconds(webm) == len(webm) / FALLBACK_BYTES_PER_S


@given(st.binary(max_size=4096))
def test_any_bytes_give_a_finite_length_and_never_raise(data: bytes) -> None:
    seconds = audio_seconds(data)
    assert 0 <= seconds < 10**7


@given(st.binary(max_size=200))
def test_truncated_headers_never_raise(tail: bytes) -> None:
    for head in (b"RIFF\x00\x00\x00\x00WAVE", b"fLaC", b"OggS", b"ID3", b"mvhd", b"\xff\xfb"):
        assert audio_seconds(head + tail) >= 0
