"""`kipside pcap summary` on a 1 GB capture, side by side with tshark's Kafka dissector.

    .venv/bin/python bench/pcap_summary.py [--capture PATH] [--seed DIR,DIR] [--size-mb 1074]
                                           [--reps 2] [--quick] [--no-doc]

The capture is real kipside traffic made big: a coalescing run and a transaction run through
kipside (tests/captures/scenarios.py: confluent-kafka and aiokafka clients, Tansu behind a
counting relay, tcpdump on loopback on both sides of kipside) are the seed; their four captures
are merged and repeated, each copy's connections renumbered (client addresses 127.2.X.Y, the
servers 127.0.1.N, all on port 9092, sequence numbers shifted, IP checksums kept right) and its
packets shifted in time after the previous copy's, until the file holds --size-mb MB (default
1 GiB). --seed takes existing run directories instead (client.pcap, broker.pcap, run.json, as
tests/captures/capture_run.py writes them). --capture PATH keeps the capture (and its seed,
beside it) and reuses it on the next run; without it everything lives in a temporary directory.

Each tool reads the same file, the order alternating between repetitions: CPU seconds and peak
RSS from the kernel (wait4), throughput as file bytes over wall time. A smaller file (1/16)
made of the same copies shows whether memory grows with the capture. Both tools' requests per
API are compared: tshark must have dissected every Kafka frame kipside counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

from _harness import HarnessError, KipsideCode, at_ref
from _measure import Window, medians, repeat
from _report import Report, Target, facts, number, output, parse_args, run_notes, table
from captures import pcapkit
from testkit import tools

from kipside.protocol import api_name

# --------------------------------------------------------------------------- the comparison

SERVER_PORT: Final = 9092
"""Every Kafka server in the big capture listens here (Wireshark's default Kafka port)."""
KIPSIDE = "kipside pcap summary"
TSHARK = "tshark"
COMMANDS: Final = {
    # The figures of a summary: every request's API, Produce bodies, answers' error codes
    # (`kipside` is the code of --ref).
    KIPSIDE: ["kipside", "pcap", "summary", "{file}", "--port", str(SERVER_PORT), "--json"],
    # tshark's Kafka dissector over every frame (TCP reassembly on, its defaults): the API of
    # each request, the partitions of Produce requests, the error codes of the answers, one
    # line per packet; -n: no name lookups.
    TSHARK: [
        *("tshark", "-n", "-r", "{file}", "-d", f"tcp.port=={SERVER_PORT},kafka"),
        *("-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,"),
        *("-e", "tcp.dstport", "-e", "kafka.api_key", "-e", "kafka.partition_id"),
        *("-e", "kafka.error"),
    ],
}
SMALL_SHARE: Final = 16
"""The small capture is 1/16 of the big one: peak RSS on both says whether memory grows."""
GIB_MB: Final = 1073.741824
OPTIONS: Final = {
    "--capture": (Path, None, "keep the capture here and reuse it next time (else a temp dir)"),
    "--seed": (str, "", "run directories to repeat (comma-separated); default: fresh runs"),
    "--size-mb": (float, GIB_MB, "size of the big capture in MB (default 1 GiB)"),
    "--reps": (int, 2, "repetitions (the tools' order alternates)"),
    "--ref": (str, "HEAD", "run kipside as of this git ref (the same code all run long)"),
}
QUICK: Final = {"size_mb": 32.0, "reps": 1}
NOISY: Final = 0.3

# --------------------------------------------------------------------------- the seed


def fresh_seed(where: Path) -> list[Path]:
    """A coalescing run and a transaction run through kipside, captured on both sides."""
    from captures.scenarios import Run, coalescing_run, transaction_run

    makers: dict[str, Callable[[Path], Run]] = {
        "coalescing": coalescing_run,
        "transactions": transaction_run,
    }
    for name, make in makers.items():
        run = where / name
        if not (run / "run.json").exists():
            print(f"capturing a {name} run through kipside into {run}", file=sys.stderr)
            if any(make(run).dropped.values()):
                shutil.rmtree(run)
                raise HarnessError(f"the kernel dropped packets in the {name} run: run again")
    return [where / name for name in makers]


_ETHERNET: Final = 14


@dataclass(frozen=True)
class SeedPacket:
    ts: float
    data: bytes
    tcp: int
    """Offset of the TCP header."""
    server_ip: bytes
    """The address its connection's server gets in every copy."""
    from_client: bool


def seed_packets(runs: Sequence[Path]) -> list[SeedPacket]:
    """Every IPv4 TCP packet of the runs' captures, in time order, its server named; the runs
    overlaid, each starting at 0 (the two sides of one run keep their timing)."""
    packets: list[SeedPacket] = []
    servers: dict[tuple[Path, str, int], bytes] = {}
    for run in runs:
        meta = json.loads((run / "run.json").read_text())
        sides = {"client.pcap": set(meta["kipside_ports"]), "broker.pcap": {meta["broker_port"]}}
        # tcpdump -i lo: pcap, microseconds, Ethernet
        records = {name: pcapkit.read_pcap(run / name) for name in sides}
        start = min(found[0].ts for found in records.values())
        for name, ports in sides.items():
            for record in records[name]:
                ts, data = record.ts, record.data
                if data[12:14] != b"\x08\x00" or data[_ETHERNET + 9] != 6:
                    continue  # not IPv4, or not TCP
                tcp = _ETHERNET + (data[_ETHERNET] & 0x0F) * 4
                sport, dport = struct.unpack_from(">HH", data, tcp)
                from_client = dport in ports
                server = (run, name, dport if from_client else sport)
                ip = servers.setdefault(server, bytes([127, 0, 1, len(servers) + 1]))
                packets.append(SeedPacket(ts - start, data, tcp, ip, from_client))
    packets.sort(key=lambda p: p.ts)
    return packets


# --------------------------------------------------------------------------- the big capture


def _fold(total: int) -> int:
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def _adjusted(checksum: int, old: bytes, new: bytes) -> int:
    """An Internet checksum after `old` 16-bit words became `new` (RFC 1624, eqn. 3)."""
    total = (~checksum & 0xFFFF) + sum(
        ~w & 0xFFFF for w in struct.unpack(f">{len(old) // 2}H", old)
    )
    total += sum(struct.unpack(f">{len(new) // 2}H", new))
    return ~_fold(total) & 0xFFFF


def renumbered(packet: SeedPacket, copy: int) -> bytes:
    """The packet as copy `copy` carries it: client 127.2.X.Y, its server's address, port 9092,
    sequence numbers shifted, the IP checksum adjusted. The TCP checksum stays as captured:
    on loopback the kernel leaves it unfilled (checksum offload), in the seed as in the copy."""
    data, tcp, ip = bytearray(packet.data), packet.tcp, _ETHERNET
    client = bytes([127, 2 + (copy >> 16), (copy >> 8) & 0xFF, copy & 0xFF])
    client_shift, server_shift = (copy * 0x9E3779B1) & 0xFFFFFFFF, (copy * 0x85EBCA77) & 0xFFFFFFFF
    old_ips = bytes(data[ip + 12 : ip + 20])
    sport, dport, seq, ack = struct.unpack_from(">HHII", data, tcp)
    if packet.from_client:
        src, dst, dport = client, packet.server_ip, SERVER_PORT
        seq, ack = seq + client_shift, ack + server_shift
    else:
        src, dst, sport = packet.server_ip, client, SERVER_PORT
        seq, ack = seq + server_shift, ack + client_shift
    new_ips = src + dst
    data[ip + 12 : ip + 20] = new_ips
    struct.pack_into(">HHII", data, tcp, sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF)
    ip_sum = struct.unpack_from(">H", data, ip + 10)[0]
    struct.pack_into(">H", data, ip + 10, _adjusted(ip_sum, old_ips, new_ips))
    return bytes(data)


def write_capture(path: Path, seed: Sequence[SeedPacket], size: int) -> dict[str, Any]:
    """Copies of the seed, one after another in time, until the file holds `size` bytes."""
    span = seed[-1].ts - seed[0].ts + 0.001
    copies = packets = 0
    with path.open("wb") as f:
        written = f.write(pcapkit.file_header())
        while written < size:
            shift = copies * span
            for packet in seed:
                data = renumbered(packet, copies)
                written += f.write(pcapkit.record_bytes(packet.ts + shift, data, len(data)))
            packets += len(seed)
            copies += 1
    return {"bytes": written, "copies": copies, "packets": packets, "seconds": copies * span}


def the_captures(args: Any, workdir: Path) -> tuple[Path, Path, dict[str, Any]]:
    """The big capture (made, or reused from --capture), the small one, and how they were made."""
    big = args.capture or workdir / "kafka-1g.pcap"
    about_file = big.with_name(big.name + ".json")
    size = int(args.size_mb * 1e6)
    seeds = [Path(s) for s in args.seed.split(",") if s]
    about = json.loads(about_file.read_text()) if about_file.exists() and big.exists() else None
    if about is None or about["bytes"] < size or (seeds and about["seed"] != list(map(str, seeds))):
        if not seeds:
            seeds = fresh_seed(big.parent / f"{big.name}.seed")
        seed = seed_packets(seeds)
        t0 = time.monotonic()
        about = write_capture(big, seed, size)
        about.update(seed=[str(s) for s in seeds], seed_packets=len(seed), made=time.ctime())
        about["seed_bytes"] = (about["bytes"] - len(pcapkit.file_header())) // about["copies"]
        about_file.write_text(json.dumps(about, indent=2))
        print(
            f"wrote {big} ({about['bytes'] / 1e6:,.0f} MB) in {time.monotonic() - t0:.0f} s",
            file=sys.stderr,
        )
    small = workdir / "kafka-small.pcap"
    seed = seed_packets([Path(s) for s in about["seed"]])
    write_capture(small, seed, about["bytes"] // SMALL_SHARE)
    return big, small, about


# --------------------------------------------------------------------------- measuring


def kipside_at(ref: str, where: Path) -> KipsideCode:
    """kipside as of git `ref`, evidence/ included (the harness's trees hold the sidecar's
    packages): the checkout may change while a run of several minutes goes on."""
    code = at_ref(ref, where)
    if code.pythonpath is None:
        raise HarnessError(f"{ref} predates the kipside.* layout (and kipside pcap)")
    link = code.pythonpath / "kipside" / "evidence"
    if not link.exists():
        link.symlink_to(where / "tree" / "evidence", target_is_directory=True)
    return code


def run_tool(tool: str, code: KipsideCode, capture: Path, logdir: Path) -> dict[str, float]:
    """One tool over one capture: wall and CPU seconds, peak RSS, what it read."""
    command = [part.format(file=capture) for part in COMMANDS[tool]]
    env = None
    if tool == KIPSIDE:
        command, env = code.command(*command[1:]), code.env()
    out, err = logdir / "stdout", logdir / "stderr"
    window = Window([]).open()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    window.close()
    if proc.returncode != 0:
        tail = err.read_text(errors="replace")[-1500:]
        raise HarnessError(f"{tool} exited with {proc.returncode}:\n{tail}")
    size_mb = capture.stat().st_size / 1e6
    cpu_s = usage.ru_utime + usage.ru_stime
    requests = kipside_requests(out) if tool == KIPSIDE else tshark_requests(out)
    return {
        "file_mb": size_mb,
        "mb_per_s": size_mb / window.wall_s,
        "wall_s": window.wall_s,
        "cpu_s": cpu_s,
        "mb_per_cpu_s": size_mb / cpu_s,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "requests": float(sum(requests.values())),
        "noise_cores": window.noise_cores(),
        **{f"api:{name}": float(n) for name, n in requests.items()},
    }


def kipside_requests(out: Path) -> Counter[str]:
    summary = json.loads(out.read_text())
    return Counter({name: api["requests"] for name, api in summary["apis"].items()})


def tshark_requests(out: Path) -> Counter[str]:
    """Requests per API in tshark's lines: the API keys of packets sent to the servers."""
    found: Counter[str] = Counter()
    port = str(SERVER_PORT)
    with out.open() as lines:
        for line in lines:
            dport, _, rest = line.partition("\t")
            if dport == port:
                keys = rest.partition("\t")[0]
                found.update(api_name(int(k)) for k in keys.split(",") if k)
    return found


# --------------------------------------------------------------------------- the report


COLUMNS = [
    ("file MB", "{file_mb:,.0f}"),
    ("MB/s", "{mb_per_s:,.1f}"),
    ("wall s", "{wall_s:,.1f}"),
    ("CPU s", "{cpu_s:,.1f}"),
    ("MB per CPU s", "{mb_per_cpu_s:,.1f}"),
    ("peak RSS MB", "{peak_rss_mb:,.0f}"),
    ("requests read", "{requests:,.0f}"),
]


def agreement(med: dict[str, dict[str, float] | None], big: str) -> str:
    """Whether both tools read the same requests per API on the big capture."""
    a, b = med.get(f"{KIPSIDE}, {big}"), med.get(f"{TSHARK}, {big}")
    if not a or not b:
        return "not compared: a tool has no result"
    apis = sorted({k for k in (*a, *b) if k.startswith("api:")})
    differ = [
        f"{k[4:]} {a.get(k, 0):,.0f} vs {b.get(k, 0):,.0f}" for k in apis if a.get(k) != b.get(k)
    ]
    if not differ:
        return f"both read the same {a['requests']:,.0f} requests, API by API ({len(apis)} APIs)"
    return "requests per API differ (kipside vs tshark): " + "; ".join(differ)


def pcap_targets(med: dict[str, dict[str, float] | None]) -> list[Target]:
    """tshark's rate on the full capture; memory bounded as the capture grows 16 times."""
    k, t = med.get(f"{KIPSIDE}, full"), med.get(f"{TSHARK}, full")
    if not (k and t):
        return [Target("at least tshark's rate on the same file", None, "a tool failed")]
    ratio = k["mb_per_s"] / t["mb_per_s"]
    per_cpu = k["mb_per_cpu_s"] / t["mb_per_cpu_s"]
    targets = [
        Target(
            "at least tshark's rate on the same file",
            ratio >= 1.0,
            f"{ratio:.2f}x ({number(k['mb_per_s'])} vs {number(t['mb_per_s'])} MB/s)",
        ),
        Target(
            "(no target) MB per CPU second, which other load on the machine disturbs less",
            None,
            f"{per_cpu:.2f}x ({number(k['mb_per_cpu_s'])} vs {number(t['mb_per_cpu_s'])})",
        ),
    ]
    ks = med.get(f"{KIPSIDE}, 1/16")
    if ks:
        targets.append(
            Target(
                "bounded memory",
                k["peak_rss_mb"] <= 1.25 * ks["peak_rss_mb"],
                f"peak RSS {number(ks['peak_rss_mb'])} MB at 1/16 of the file, "
                f"{number(k['peak_rss_mb'])} MB on all of it",
            )
        )
    return targets


def how_measured(
    args: Any, code: KipsideCode, about: dict[str, Any], med: dict[str, dict[str, float] | None]
) -> list[str]:
    seed_mb = about["seed_bytes"] / 1e6
    return [
        f"kipside: {code.label}",
        f"tshark: {output(['tshark', '--version'])}",
        f"Capture: {about['bytes'] / 1e6:,.0f} MB, {about['packets']:,} packets, "
        f"{about['copies']:,} renumbered copies of {about['seed_packets']:,} packets "
        f"({seed_mb:.2f} MB) captured by tcpdump on loopback: "
        + ", ".join(f"`{Path(s).name}`" for s in about["seed"]),
        "Commands (FILE the capture): "
        + "; ".join(f"`{' '.join(c).format(file='FILE')}`" for c in COMMANDS.values()),
        f"Repetitions: {args.reps}, the tools' order alternating; median reported.",
        f"Both tools' requests per API on the full capture: {agreement(med, 'full')}",
    ]


def main() -> int:
    args = parse_args(__doc__, OPTIONS, QUICK)
    tools.find("tshark", "the dissector kipside pcap is measured against")
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pcapbench-")))
        code = kipside_at(args.ref, workdir / "code")
        big, small, about = the_captures(args, workdir)
        sizes = {"1/16": small, "full": big}
        cases = {
            f"{tool}, {size}": partial(run_tool, tool, code, path)
            for size, path in sizes.items()
            for tool in (KIPSIDE, TSHARK)
        }
        runs = repeat(cases, args.reps, noisy=NOISY, retries=1, budget=600)
    med = {case: medians(runs, case) for case in cases}
    found = table(f"Results (median of {args.reps})", list(cases), med, COLUMNS, first="")
    Report(
        "pcap",
        "Packet capture summary: kipside pcap vs tshark's Kafka dissector",
        facts(*how_measured(args, code, about, med)),
        [found],
        pcap_targets(med),
        notes=run_notes(runs, NOISY),
    ).publish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
