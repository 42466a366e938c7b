#!/usr/bin/env python3
"""Checks that a script stops everything it started, after a normal run or a Ctrl-C.

  interrupt-check.py [--after S] [--when REGEX] [--group] [--timeout T] -- COMMAND...

Runs COMMAND (e.g. `./build.sh demo`) with SIGINT at its default disposition (a shell started
in the background by another non-interactive shell would ignore it), sends SIGINT after S
seconds (counted from the first output line matching --when, if given; the command's
output is passed through) (to the script alone, or with --group to its whole process group, as a terminal's
Ctrl-C does), waits at most T seconds for it to exit, then lists processes that appeared
during the run and are still alive: any descendant of COMMAND, and any Envoy, replica-emulator,
prefix-load, wrk or llama-server whose command line contains --mark (default "/.work/", where
the scripts keep their configs; this leaves other users' processes out). Without --after the command runs to its end. Exit status 0 if
nothing is left behind, 1 otherwise (the leftovers are printed, not killed: inspect them).
"""

import argparse
import os
import re
import threading
import signal
import subprocess
import sys
import time

WATCH = ("envoy", "replica-emulator", "prefix-load", "wrk", "llama-server")


def procs():
    """pid -> (ppid, command line) for every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] == "Z":
            continue
        out[int(d)] = (int(fields[1]), cmd)
    return out


def descendants(root, table):
    kids, todo = set(), [root]
    while todo:
        p = todo.pop()
        for pid, (ppid, _) in table.items():
            if ppid == p and pid not in kids:
                kids.add(pid)
                todo.append(pid)
    return kids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--after", type=float, help="send SIGINT after this many seconds")
    ap.add_argument("--when", help="count --after from the first output line matching this")
    ap.add_argument("--group", action="store_true", help="signal the whole process group")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--mark", default="/.work/",
                    help="a non-descendant counts only if its command line contains this "
                    "(Envoy is started in its own session; its config lives under .work/)")
    ap.add_argument("command", nargs="+")
    a = ap.parse_args()

    before = set(procs())
    seen = set()
    child = subprocess.Popen(
        a.command,
        preexec_fn=lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL), os.setpgid(0, 0)),
        stdout=subprocess.PIPE if a.when else None,
        stderr=subprocess.STDOUT if a.when else None,
    )
    start = time.monotonic()
    matched = threading.Event()
    if a.when:
        def pump():
            pat = re.compile(a.when)
            for raw in child.stdout:
                line = raw.decode(errors="replace")
                sys.stdout.write(line)
                sys.stdout.flush()
                if not matched.is_set() and pat.search(line):
                    matched.set()
        threading.Thread(target=pump, daemon=True).start()
    else:
        matched.set()
    armed_at = None
    sent = False
    while child.poll() is None:
        table = procs()
        kids = descendants(child.pid, table)
        seen |= {p for p in table if p not in before and
                 (p in kids or (a.mark in table[p][1] and any(w in table[p][1] for w in WATCH)))}
        elapsed = time.monotonic() - start
        if matched.is_set() and armed_at is None:
            armed_at = time.monotonic()
        if (a.after is not None and not sent and armed_at is not None
                and time.monotonic() - armed_at >= a.after):
            print(f"interrupt-check: SIGINT to {'group' if a.group else 'pid'} {child.pid} "
                  f"after {elapsed:.1f} s", file=sys.stderr)
            if a.group:
                os.killpg(child.pid, signal.SIGINT)
            else:
                os.kill(child.pid, signal.SIGINT)
            sent = True
            sent_at = time.monotonic()
        if elapsed > a.timeout:
            print("interrupt-check: timeout, killing the command", file=sys.stderr)
            child.kill()
            break
        time.sleep(0.1)
    rc = child.wait()
    stop_s = time.monotonic() - sent_at if sent else 0.0
    time.sleep(0.5)
    table = procs()
    left = sorted(p for p in seen if p in table)
    print(f"interrupt-check: exit status {rc}; {len(seen)} processes appeared during the run"
          + (f"; stopped {stop_s:.1f} s after SIGINT" if sent else ""), file=sys.stderr)
    for p in left:
        print(f"LEFT BEHIND: pid {p}: {table[p][1][:200]}", file=sys.stderr)
    if not left:
        print("interrupt-check: nothing left behind", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
