#!/usr/bin/env python3
"""Instructions per fresh call of the example server, with the extension (`required`) and
without it (`off`), counted by valgrind's callgrind: a figure that the machine's noise does not
move, for before/after comparisons of the miss path that a timed load cannot resolve.

Each mode's server runs twice under callgrind, for N1 and then N2 fresh `message/send` calls
of about 2 KB of params (8 client threads); the difference of the two totals, over N2 - N1,
is what one call costs, start-up and shutdown taken out. Then the functions whose share grew
most from `off` to `required` are listed.

Caveats, both in the figures: callgrind counts user-space instructions only (not the kernel's
writes and fsyncs), and valgrind hides SHA-NI from the CPU it emulates, so SHA-256 runs in
software here (about 55 instructions a byte, ten times what the hardware takes).

    python3 benches/load/instructions.py [--bin PATH] [--n1 400] [--n2 2000] [--top 30]
"""

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1"
TEXT = (
    "Please review the attached quarterly operations summary and produce a short briefing for "
    "the regional leads. Focus on the change in ticket backlog since the previous quarter, the "
    "on-call incidents that breached their response objective, and any vendor contracts that "
    "renew in the next sixty days. Cite the section of the source for every figure you quote. "
) * 3
METADATA = {
    "client": {"name": "instructions", "version": "1.0.0", "locale": "en-GB"},
    "trace": {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "00f067aa0ba902b7"},
    "tenant": {"orgId": "org_7f3a9c12", "region": "eu-west-1", "quota": {"dailyTasks": 5000}},
    "request": {"priority": 5, "retryPolicy": {"maxAttempts": 4, "backoff": "exponential"},
                "tags": ["briefing", "quarterly", "ops", "citations"]},
}


def body(message_id):
    message = {"kind": "message", "messageId": message_id, "role": "user",
               "parts": [{"kind": "text", "text": TEXT}], "metadata": METADATA}
    params = {"message": message, "metadata": {"durationMs": 500}}
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": params},
                      separators=(",", ":"))


def send(port, calls, threads=8):
    failures = []

    def client(count):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        headers = {"Content-Type": "application/json", "A2A-Extensions": EXTENSION}
        for _ in range(count):
            conn.request("POST", "/", body(str(uuid.uuid4())), headers)
            reply = conn.getresponse()
            answer = reply.read()
            if reply.status != 200 or b'"result"' not in answer:
                failures.append((reply.status, answer[:200]))

    workers = [threading.Thread(target=client, args=(calls // threads,)) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        sys.exit(f"instructions: {len(failures)} calls failed, the first: {failures[0]}")
    return calls // threads * threads


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profile(binary, mode, calls, workdir):
    """Runs the server under callgrind for `calls` calls; returns (calls sent, {function: Ir})."""
    port = free_port()
    out = os.path.join(workdir, f"{mode}-{calls}.callgrind")
    db = os.path.join(workdir, f"{mode}-{calls}.db")
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary,
         "--listen", f"127.0.0.1:{port}", "--db", db, "--idempotency", mode],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/.well-known/agent-card.json")
                conn.getresponse().read()
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    sys.exit("instructions: the server under valgrind did not start")
                time.sleep(0.2)
        sent = send(port, calls)
        time.sleep(2)  # the missions of the last calls (500 ms) complete
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
    return sent, functions(out)


def functions(callgrind_out):
    """Self cost (Ir) by function, from callgrind_annotate."""
    text = subprocess.run(["callgrind_annotate", "--threshold=100", callgrind_out],
                          capture_output=True, text=True, check=True).stdout
    costs = {}
    for line in text.splitlines():
        found = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*?)(?: \[.*\])?$", line)
        if found:
            name = found.group(2).split(":", 1)[-1]
            costs[name] = costs.get(name, 0) + int(found.group(1).replace(",", ""))
    return costs


def per_call(binary, mode, n1, n2, workdir):
    sent1, few = profile(binary, mode, n1, workdir)
    sent2, many = profile(binary, mode, n2, workdir)
    calls = sent2 - sent1
    return {name: (many.get(name, 0) - few.get(name, 0)) / calls for name in set(few) | set(many)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", help="the server to measure (default: the release example, "
                        "built here into $CARGO_TARGET_DIR or ~/.cache/idem-target, as run.sh does)")
    parser.add_argument("--n1", type=int, default=400)
    parser.add_argument("--n2", type=int, default=2000)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    if args.bin is None:
        # Built here, into the directory it is then read from: a `cargo build` of its own
        # went to ./target while the script read another, older binary (helper-105).
        target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/idem-target"))
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        subprocess.run(["cargo", "build", "--quiet", "--release", "--example", "a2a_server"],
                       cwd=repo, env={**os.environ, "CARGO_TARGET_DIR": target}, check=True)
        args.bin = os.path.join(target, "release/examples/a2a_server")
    with tempfile.TemporaryDirectory() as workdir:
        off = per_call(args.bin, "off", args.n1, args.n2, workdir)
        required = per_call(args.bin, "required", args.n1, args.n2, workdir)
    total = "PROGRAM TOTALS"
    sha = "sha2::sha256::compress256"
    print(f"instructions per fresh call: off {off[total]:,.0f}, required {required[total]:,.0f} "
          f"(ratio {required[total] / off[total]:.2f})")
    without = required[total] - required.get(sha, 0) - off[total] + off.get(sha, 0)
    print(f"required - off: {required[total] - off[total]:,.0f}, of which SHA-256 in software "
          f"{required.get(sha, 0) - off.get(sha, 0):,.0f}; the rest {without:,.0f}")
    grown = sorted(((required.get(n, 0) - off.get(n, 0), n) for n in set(off) | set(required)
                    if n != total), reverse=True)
    print(f"\n{'required - off':>15} {'required':>10} {'off':>10}  function")
    for extra, name in grown[:args.top]:
        print(f"{extra:15,.0f} {required.get(name, 0):10,.0f} {off.get(name, 0):10,.0f}  {name[:100]}")


if __name__ == "__main__":
    main()
