"""How long an uploaded audio file plays, from its container's header, without decoding it.

Speech-to-text is charged by the seconds of audio it transcribes. Read here: WAV (the
``fmt `` and ``data`` chunks), FLAC (STREAMINFO), MP3 (a Xing/Info frame count, else the
first frame's bitrate over the file), Ogg Opus and Vorbis (the last page's granule
position), MP4/M4A (``mvhd``). Anything else (WebM from a browser's recorder has no
duration in its header) is estimated from its size at :data:`FALLBACK_BYTES_PER_S`.
Pure functions of bytes; nothing here trusts a header past the data it has.
"""

from __future__ import annotations

import struct

# 32 kbit/s: a browser's Opus recording of speech is about this; a higher real rate only
# makes the estimate of a file too long (charged more), never unbounded.
FALLBACK_BYTES_PER_S = 4000.0

_MP3_BITRATES = {  # kbit/s by (MPEG-1?, index), layer III
    True: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    False: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _wav(data: bytes) -> float | None:
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    at, byte_rate = 12, 0
    while at + 8 <= len(data):
        chunk, size = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if chunk == b"fmt " and at + 20 <= len(data):
            byte_rate = struct.unpack_from("<I", data, at + 16)[0]
        elif chunk == b"data":
            if not byte_rate:
                return None
            # A streamed WAV says 0 or 0xFFFFFFFF: what is there counts.
            present = len(data) - at - 8
            return (size if 0 < size <= present else present) / byte_rate
        at += 8 + size + (size & 1)
    return None


def _flac(data: bytes) -> float | None:
    if len(data) < 42 or data[:4] != b"fLaC":
        return None
    info = data[8:42]  # STREAMINFO is the first metadata block
    packed = int.from_bytes(info[10:18], "big")
    rate = packed >> 44
    samples = packed & ((1 << 36) - 1)
    return samples / rate if rate and samples else None


def _mp3(data: bytes) -> float | None:
    at = 0
    if data[:3] == b"ID3" and len(data) >= 10:
        size = data[6:10]
        at = 10 + ((size[0] << 21) | (size[1] << 14) | (size[2] << 7) | size[3])
    limit = min(len(data) - 4, at + 65536)
    while at < limit:
        if data[at] == 0xFF and data[at + 1] & 0xE0 == 0xE0:
            version = (data[at + 1] >> 3) & 3
            layer = (data[at + 1] >> 1) & 3
            rate_index = (data[at + 2] >> 2) & 3
            bit_index = data[at + 2] >> 4
            if version != 1 and layer == 1 and rate_index < 3 and 0 < bit_index < 15:
                mpeg1 = version == 3
                rate = _MP3_RATES[version][rate_index]
                per_frame = 1152 if mpeg1 else 576
                frames = _xing_frames(data, at)
                if frames:
                    return frames * per_frame / rate
                return (len(data) - at) * 8 / (_MP3_BITRATES[mpeg1][bit_index] * 1000)
        at += 1
    return None


def _xing_frames(data: bytes, frame: int) -> int | None:
    """The frame count of a Xing/Info header in the first frame (VBR files)."""
    head = data[frame : frame + 200]
    for tag in (b"Xing", b"Info"):
        i = head.find(tag)
        if i >= 0 and i + 12 <= len(head) and struct.unpack_from(">I", head, i + 4)[0] & 1:
            return int(struct.unpack_from(">I", head, i + 8)[0])
    return None


def _ogg(data: bytes) -> float | None:
    if data[:4] != b"OggS" or len(data) < 47:
        return None
    body = data[28:]
    if body.startswith(b"OpusHead"):
        rate, skip = 48000, struct.unpack_from("<H", body, 10)[0]
    elif body[1:7] == b"vorbis":
        rate, skip = struct.unpack_from("<I", body, 12)[0], 0
    else:
        return None
    last = data.rfind(b"OggS")
    if last < 0 or last + 14 > len(data) or not rate:
        return None
    granule = struct.unpack_from("<q", data, last + 6)[0]
    return max(0.0, (granule - skip) / rate) if granule > 0 else None


def _mp4(data: bytes) -> float | None:
    i = data.find(b"mvhd")
    if i < 0 or i + 32 > len(data):
        return None
    if data[i + 4] == 1:
        scale, duration = struct.unpack_from(">IQ", data, i + 24)
    else:
        scale, duration = struct.unpack_from(">II", data, i + 16)
    return duration / scale if scale else None


def audio_seconds(data: bytes) -> float:
    """The playing time of ``data`` in seconds (estimated from its size when the container
    does not say)."""
    for read in (_wav, _flac, _ogg, _mp4, _mp3):
        try:
            seconds = read(data)
        except (struct.error, IndexError, KeyError):
            seconds = None
        if seconds is not None and seconds >= 0:
            return seconds
    return len(data) / FALLBACK_BYTES_PER_S
