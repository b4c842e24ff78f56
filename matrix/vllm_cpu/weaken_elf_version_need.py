"""Mark named symbol-version requirements of an ELF64 shared object weak (VER_FLG_WEAK).

usage: python matrix/vllm_cpu/weaken_elf_version_need.py FILE.so VERSION [VERSION ...]
e.g.   python matrix/vllm_cpu/weaken_elf_version_need.py .../vllm/_C.abi3.so GLIBCXX_3.4.32

Why the real-vLLM cell needs it: vllm-cpu 0.8.5.post2's ``vllm/_C.abi3.so`` was linked against
GCC 13's libstdc++ and requires GLIBCXX_3.4.32, but only for ``std::ios_base_library_init``,
which GCC 13's <iostream> names with a bare ``.globl`` that no relocation uses. Debian 12 and
Ubuntu 22.04 ship libstdc++ 12 (up to GLIBCXX_3.4.30), so the loader refuses the file
("version `GLIBCXX_3.4.32' not found"), vLLM only warns, and the engine dies later without its
custom ops (``'_OpNamespace' '_C' object has no attribute 'silu_and_mul'``). The loader only
checks a weak requirement, it does not enforce it, so the file then loads.

Safe by construction: a version that any relocation's symbol is bound to is refused (exit 1),
so only a requirement nothing uses can be weakened. Where the system libstdc++ does have the
version, a weak requirement that is met is simply met. Running it twice changes nothing.
"""

from __future__ import annotations

import struct
import sys

VER_FLG_WEAK = 0x2
SHT_RELA, SHT_REL = 4, 9
SHT_GNU_VERNEED, SHT_GNU_VERSYM = 0x6FFFFFFE, 0x6FFFFFFF


def _sections(data: bytes) -> list[dict]:
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    out = []
    for i in range(shnum):
        _name, typ, _flags, _addr, offset, size, link, info, _align, _entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize
        )
        out.append(dict(type=typ, offset=offset, size=size, link=link, info=info))
    return out


def _versions_used_by_relocations(data: bytes, sections: list[dict]) -> set[int]:
    versym = next((s for s in sections if s["type"] == SHT_GNU_VERSYM), None)
    if versym is None:
        return set()
    used = set()
    for sec in sections:
        if sec["type"] not in (SHT_RELA, SHT_REL):
            continue
        entsize = 24 if sec["type"] == SHT_RELA else 16
        for i in range(sec["size"] // entsize):
            (r_info,) = struct.unpack_from("<Q", data, sec["offset"] + i * entsize + 8)
            symbol = r_info >> 32
            if symbol:
                used.add(struct.unpack_from("<H", data, versym["offset"] + 2 * symbol)[0] & 0x7FFF)
    return used


def weaken(path: str, names: set[str]) -> list[str]:
    """Weaken the requirements named ``names`` in ``path``; returns the messages to print."""
    data = bytearray(open(path, "rb").read())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit(f"{path}: not a little-endian ELF64 file")
    sections = _sections(data)
    verneed = next((s for s in sections if s["type"] == SHT_GNU_VERNEED), None)
    if verneed is None:
        return [f"{path}: no version requirements, nothing to do"]
    strtab = sections[verneed["link"]]

    def string(offset: int) -> str:
        start = strtab["offset"] + offset
        return bytes(data[start : data.index(b"\0", start)]).decode()

    used = _versions_used_by_relocations(data, sections)
    messages, seen = [], set()
    entry = verneed["offset"]
    for _ in range(verneed["info"]):
        _version, count, file_off, aux_off, next_off = struct.unpack_from("<HHIII", data, entry)
        aux = entry + aux_off
        for _ in range(count):
            _hash, flags, index, name_off, aux_next = struct.unpack_from("<IHHII", data, aux)
            name = string(name_off)
            if name in names:
                seen.add(name)
                if index in used:
                    raise SystemExit(f"{path}: {name} is bound to a relocated symbol: refusing to weaken it")
                if flags & VER_FLG_WEAK:
                    messages.append(f"{path}: {string(file_off)} {name} already weak")
                else:
                    struct.pack_into("<H", data, aux + 4, flags | VER_FLG_WEAK)
                    messages.append(f"{path}: {string(file_off)} {name} marked weak")
            aux += aux_next
        if not next_off:
            break
        entry += next_off
    if any(m.endswith("marked weak") for m in messages):
        with open(path, "wb") as fh:
            fh.write(bytes(data))
    messages += [f"{path}: {name} not required here" for name in sorted(names - seen)]
    return messages


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    for message in weaken(argv[1], set(argv[2:])):
        print(message)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
