#!/usr/bin/env python3
"""Writes apps/kimi_k3_hot.ld: the code sections kimi_k3 runs, grouped at the start of its code.

Why (docs/streaming.md §1.11): the kernel maps a program's code in 64 KB windows around each page
it runs (fault-around). kimi_k3's 2.7 MB of code has the functions a run uses spread over the
whole file, so an assets/k3-mini run mapped 37 windows, 588 of its 694 code pages, for under
1 MB of functions it ran. Listed in one output section before `.text`, they fill ~15 windows
(262 pages mapped).

How: the build's own link of kimi_k3 (Ninja's command for apps/kimi_k3) is run twice from the
build folder:
  1. as it is, with a link map: the `.text.*` input sections the program keeps, each named by its
     object file and section name (every function is in a section of its own:
     -ffunction-sections, CMakeLists.txt; the static C++ runtime too; a function of an anonymous
     namespace has the same section name in each ISA's file, so the file tells them apart);
  2. with every one of those sections in a 64 KB window of its own and a 64 KB-aligned load
     address, so that the kernel's windows are the sections' (a probe, ~0.26 GB on disk), run on
     the workloads below with a small preloaded library that writes, at exit, which code pages
     were mapped: a mapped window is a section the run reached;
  3. the sections reached by any workload are written, grouped by the runs that reach them, to
     the output script, which apps/CMakeLists.txt passes to the linker (`INSERT BEFORE .text`:
     GNU ld keeps its default script). A name that no longer exists matches nothing; a function
     the list lacks stays in `.text`, where it costs a window again. Run this after changes to
     what a run calls:
       scripts/hot_text.py --build build   (then rebuild kimi_k3)

Needs: a Release build folder configured for Ninja with the default unity batches (`make
build`), a C compiler, Linux with /proc/self/pagemap readable, and a CPU with AVX2 (one workload
runs K3_ISA=avx2). The probe is written into the build folder; K3_* and COLI_* variables are
cleared for its runs.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

WINDOW = 1 << 16  # the kernel's default fault_around_bytes

PRELOAD_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <unistd.h>
#include <fcntl.h>
/* At exit, into $HOT_TEXT_OUT: "base <hex>" (the program's first mapping, the load base of a
   PIE), then the mapped pages of its executable mappings as offsets from that base, one hex
   number a line. */
__attribute__((destructor)) static void hot_text_dump(void) {
  const char* out = getenv("HOT_TEXT_OUT");
  if (!out) return;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return;
  exe[n] = 0;
  FILE* maps = fopen("/proc/self/maps", "r");
  int pagemap = open("/proc/self/pagemap", O_RDONLY);
  FILE* dst = maps && pagemap >= 0 ? fopen(out, "w") : NULL;
  if (!dst) {
    if (maps) fclose(maps);
    if (pagemap >= 0) close(pagemap);
    return;
  }
  char line[8192];
  uintptr_t base = 0;
  long page = sysconf(_SC_PAGESIZE);
  while (fgets(line, sizeof line, maps)) {
    uintptr_t lo, hi;
    char perms[8], path[4096] = "";
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %*s %*s %*s %4095s", &lo, &hi, perms, path) < 3)
      continue;
    if (strcmp(path, exe) != 0) continue;
    if (!base) {
      base = lo;
      fprintf(dst, "base %" PRIxPTR "\n", base);
    }
    if (perms[2] != 'x') continue;
    for (uintptr_t a = lo; a < hi; a += page) {
      uint64_t entry = 0;
      if (pread(pagemap, &entry, 8, (off_t)(a / page * 8)) == 8 && (entry >> 63))
        fprintf(dst, "%" PRIxPTR "\n", a - base);
    }
  }
  fclose(dst);
  fclose(maps);
  close(pagemap);
}
"""


def link_command(build):
    cmds = subprocess.run(["ninja", "-C", build, "-t", "commands", "apps/kimi_k3"],
                          capture_output=True, text=True)
    if cmds.returncode != 0 or not cmds.stdout.strip():
        sys.exit(f"hot_text: `ninja -C {build} -t commands apps/kimi_k3` failed (a Ninja build "
                 f"folder from `make build` is needed): {cmds.stderr.strip()}")
    cmd = cmds.stdout.strip().splitlines()[-1]
    # The build's command may already carry the hot script; the probe links without it.
    cmd = re.sub(r"\s-Wl,-T,\S*kimi_k3_hot\.ld", "", cmd)
    if "kimi_k3_hot.ld" in cmd:
        sys.exit(f"hot_text: could not take kimi_k3_hot.ld out of the link command: {cmd[:300]}")
    if " -o apps/kimi_k3 " not in cmd:
        sys.exit(f"hot_text: no `-o apps/kimi_k3` in the link command: {cmd[:200]}")
    return cmd


def link(build, cmd, out, extra):
    full = cmd.replace(" -o apps/kimi_k3 ", f" -o {shlex.quote(out)} {extra} ")
    r = subprocess.run(full, shell=True, cwd=build, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"hot_text: link failed: {r.stderr[-2000:]}")


def file_pattern(path):
    """The linker-script file pattern of a map's file column: `*libx.a:member.o` for an archive
    member, `*name.o` for an object (no directories: the list holds for any build folder)."""
    m = re.match(r"(.*)\((.+)\)$", path)
    if m:
        return f"*{os.path.basename(m.group(1))}:{m.group(2)}"
    return f"*{os.path.basename(path)}"


def map_sections(path):
    """((file pattern, section name), address, size) of each `.text.*` input section in a GNU ld
    map, in link order."""
    rows, pending = [], None
    in_map = False
    with open(path) as f:
        for line in f:
            if line.startswith("Linker script and memory map"):
                in_map = True
                continue
            if not in_map:
                continue
            if pending:
                m = re.match(r"\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+(\S.*)$", line)
                if m:
                    rows.append(((file_pattern(m.group(3)), pending), int(m.group(1), 16),
                                 int(m.group(2), 16)))
                pending = None
                continue
            m = re.match(r"^ (\.text\.\S+)(?:\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+(\S.*))?$",
                         line.rstrip("\n"))
            if m:
                if m.group(2):
                    rows.append(((file_pattern(m.group(4)), m.group(1)), int(m.group(2), 16),
                                 int(m.group(3), 16)))
                else:
                    pending = m.group(1)
    return [r for r in rows if r[2] > 0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="assets/k3-mini")
    ap.add_argument("--out", default="apps/kimi_k3_hot.ld")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    model = os.path.abspath(args.model)
    # The list names object files, and the default build's are unity batches (CMakeLists.txt,
    # K3_UNITY_BUILD): a folder that compiles every file alone would write names it never matches.
    cache = os.path.join(build, "CMakeCache.txt")
    try:
        with open(cache) as f:
            unity = any(line.strip() == "K3_UNITY_BUILD:BOOL=ON" for line in f)
    except OSError as e:
        sys.exit(f"hot_text: {cache}: {e.strerror} (a configured build folder is needed)")
    if not unity:
        sys.exit(f"hot_text: {build} is not configured with K3_UNITY_BUILD=ON (the default), "
                 "whose object files apps/kimi_k3_hot.ld names")
    cmd = link_command(build)

    def script_line(key):
        pattern, name = key
        return f"    {pattern}({name})\n"

    with tempfile.TemporaryDirectory(prefix="hot_text.", dir=build) as tmp:
        plain, probe = os.path.join(tmp, "plain"), os.path.join(tmp, "probe")
        link(build, cmd, plain, f"-Wl,-Map,{tmp}/plain.map")
        keys = list(dict.fromkeys(key for key, _, _ in map_sections(f"{tmp}/plain.map")))
        if not keys:
            sys.exit(f"hot_text: no .text.* input sections in the link map of {plain}")
        with open(f"{tmp}/probe.ld", "w") as f:
            f.write("SECTIONS\n{\n  .text.k3_probe :\n  {\n")
            for key in keys:
                f.write(f"    . = ALIGN({WINDOW:#x});\n" + script_line(key))
            # The last section must not share a window with the start of `.text`.
            f.write(f"    . = ALIGN({WINDOW:#x});\n  }}\n}}\nINSERT BEFORE .text;\n")
        link(build, cmd, probe, f"-Wl,-T,{tmp}/probe.ld -Wl,-Map,{tmp}/probe.map "
             f"-Wl,-z,max-page-size={WINDOW:#x}")
        where = map_sections(f"{tmp}/probe.map")

        with open(f"{tmp}/preload.c", "w") as f:
            f.write(PRELOAD_C)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", f"{tmp}/preload.so",
                        f"{tmp}/preload.c"], check=True)

        ids = ",".join(str(i) for i in range(100, 116))
        runs = []
        for isa in ("", "avx2"):
            runs.append((isa, ["--ids", ids, "-n", "32", "--no-pin"]))
            runs.append((isa, ["--chat", "Hello, who are you?", "-n", "32"]))
        reached = {}  # section -> the runs that reached it, as bits (the first run the highest)
        for index, (isa, run_args) in enumerate(runs):
            what = f"{isa or 'default ISA'} {run_args[0]}"
            pages_file = f"{tmp}/pages{index}"
            env = {k: v for k, v in os.environ.items() if not k.startswith(("K3_", "COLI_"))}
            env.update(LD_PRELOAD=f"{tmp}/preload.so", HOT_TEXT_OUT=pages_file)
            if isa:
                env["K3_ISA"] = isa
            state = tempfile.mkdtemp(dir=tmp)
            r = subprocess.run([probe, model, *run_args, "--state-dir", state], env=env,
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"hot_text: the probe failed ({what}): {r.stderr[-1000:]}")
            if not os.path.exists(pages_file):
                sys.exit(f"hot_text: the probe's run ({what}) wrote no page list (is "
                         f"/proc/self/pagemap readable?)")
            lines = open(pages_file).read().split("\n")
            if not lines[0].startswith("base "):
                sys.exit(f"hot_text: {pages_file}: no 'base' line")
            base = int(lines[0].split()[1], 16)
            if base % WINDOW:
                sys.exit(f"hot_text: the probe was loaded at {base:#x}, not on a {WINDOW:#x} "
                         f"boundary (the kernel did not honour the segments' alignment), so "
                         f"its windows are not its sections'")
            pages = {int(x, 16) // WINDOW for x in lines[1:] if x}
            hit = {key for key, addr, size in where
                   if any(w in pages
                          for w in range(addr // WINDOW, (addr + size - 1) // WINDOW + 1))}
            if not hit:
                sys.exit(f"hot_text: the probe's run ({what}) reached no section")
            print(f"hot_text: {what}: {len(hit)} sections reached")
            for key in hit:
                reached[key] = reached.get(key, 0) | 1 << (len(runs) - 1 - index)

    # Grouped by the runs that reach them: what every run reaches first, then what the first run
    # (the default ISA, --ids) reaches, and so on; link order within a group. A run then finds the
    # code it does not use (the other ISA's kernels, the chat template) together at the end.
    order = {key: i for i, key in enumerate(keys)}
    hot = sorted(reached, key=lambda key: (-reached[key], order[key]))
    size = sum(s for key, _, s in where if key in reached)
    with open(args.out + ".tmp", "w") as f:
        f.write("/* The code sections kimi_k3 runs on assets/k3-mini (--ids and --chat, the default\n"
                "   ISA and K3_ISA=avx2), grouped before the rest of its code so that they fill few of\n"
                "   the kernel's 64 KB fault-around windows. Written by scripts/hot_text.py; do not\n"
                "   edit.\n"
                f"   {len(hot)} sections, {size} bytes. */\n")
        f.write("SECTIONS\n{\n  .text.k3_hot :\n  {\n")
        for key in hot:
            f.write(script_line(key))
        f.write("  }\n}\nINSERT BEFORE .text;\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(args.out + ".tmp", args.out)
    print(f"hot_text: {len(hot)} of {len(keys)} sections ({size} bytes) -> {args.out}")


if __name__ == "__main__":
    main()
