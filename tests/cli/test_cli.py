#!/usr/bin/env python3
"""Command-line tests of `maskpack` (Python standard library only).

usage: test_cli.py MASKPACK_BINARY SOURCE_ROOT [CASE...]   (no CASE: run every case)

Each case runs the binary and checks its exit status and output; test input files (.npy, .npz,
.safetensors) are written here with struct and zipfile, independently of the C writers.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

BIN = None
ROOT = None
TMP = None
FAILURES = []

# ---- tiny independent writers and readers ---------------------------------------------------------

DESCR = {"b1": ("|b1", "B", 1), "u1": ("|u1", "B", 1), "i4": ("<i4", "i", 4), "i8": ("<i8", "q", 8),
         "f4": ("<f4", "f", 4)}


def npy(kind, shape, values):
    descr, fmt, _ = DESCR[kind]
    shape_txt = "(%s)" % (", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else ""))
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_txt)
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + \
        struct.pack("<%d%s" % (len(values), fmt), *values)


def npz(path, members, deflate=True):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z:
        for name, (kind, shape, values) in members.items():
            z.writestr(name + ".npy", npy(kind, shape, values))


def safetensors(path, members):
    st = {"i8": "I64", "i4": "I32", "b1": "BOOL", "u1": "U8", "f4": "F32"}
    header, data = {"__metadata__": {"source": "test_cli.py"}}, b""
    for name, (kind, shape, values) in members.items():
        raw = struct.pack("<%d%s" % (len(values), DESCR[kind][1]), *values)
        header[name] = {"dtype": st[kind], "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_npy(data):
    assert data[:6] == b"\x93NUMPY", "not an npy"
    hlen = struct.unpack("<H", data[8:10])[0]
    header = eval(data[10:10 + hlen].decode(), {}, {})  # our own test output: a Python dict literal
    if header["descr"].startswith("<U"):  # a text item: a 0-d numpy string, UCS-4
        assert header["shape"] == (), "text items are 0-d"
        return (), data[10 + hlen:].decode("utf-32-le")
    kinds = {"|b1": "B", "|u1": "B", "<i4": "i", "<i8": "q", "<f4": "f", "<f8": "d", "<i2": "h", "|i1": "b"}
    fmt = kinds[header["descr"]]
    n = 1
    for d in header["shape"]:
        n *= d
    values = struct.unpack("<%d%s" % (n, fmt), data[10 + hlen:])
    return header["shape"], list(values)


def read_npz(path):
    out = {}
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None, "CRC error"
        for name in z.namelist():
            out[name[:-4]] = read_npy(z.read(name))
    return out


# ---- running the binary ----------------------------------------------------------------------------


def run(*args, stdin=None, timeout=60):
    p = subprocess.run([BIN] + list(args), capture_output=True, timeout=timeout, input=stdin)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what)


def expect(args, status, out_has=(), err_has=(), out_lacks=(), stdin=None, timeout=60):
    rc, out, err = run(*args, stdin=stdin, timeout=timeout)
    check(rc == status, "%s: exit %d, expected %d\nstdout:\n%s\nstderr:\n%s" % (" ".join(args), rc, status, out, err))
    for s in out_has:
        check(s in out, "%s: stdout lacks %r\nstdout:\n%s" % (" ".join(args), s, out))
    for s in err_has:
        check(s in err, "%s: stderr lacks %r\nstderr:\n%s" % (" ".join(args), s, err))
    for s in out_lacks:
        check(s not in out, "%s: stdout has %r" % (" ".join(args), s))
    return out


# ---- cases ------------------------------------------------------------------------------------------

SAMPLE_SEGMENTS = [(0, 0, 11), (1, 0, 7), (1, 7, 6), (2, 4, 12)]


def case_version_help():
    expect(["--version"], 0, out_has=["maskpack 0.1.0\n"])
    expect(["help"], 0, out_has=["maskpack inspect [FILE]"])
    expect(["help", "inspect"], 0, out_has=["--mask-convention", "--emit"])
    expect(["inspect", "--help"], 0, out_has=["--cu-form te|npu"])
    expect([], 2)
    expect(["frobnicate"], 2, err_has=["unknown command 'frobnicate'"])


def case_sample_text():
    out = expect(["inspect"], 0, out_has=["sample batch (embedded)", "shape: [3, 16]", "sequences: 4, longest: 12",
                                         "tokens: 36 of 48, pad fraction: 0.250", "problems: none"])
    rows = [tuple(int(x) for x in line.split()) for line in out.splitlines()
            if len(line.split()) == 3 and all(x.isdigit() for x in line.split())]
    check(rows == SAMPLE_SEGMENTS, "sample segments %r" % rows)
    # the file the sample was made from gives the same answer, once the conventions are named
    sample = os.path.join(ROOT, "data", "sample_batch.npz")
    out2 = expect(["inspect", sample, "--mask-convention", "keep", "--position-rule", "reset"], 0,
                  out_has=["problems: none"])
    check(out2.split("\n", 1)[1].replace("  (sample conventions: --mask-convention keep --position-rule reset)\n", "")
          == out.split("\n", 1)[1].replace("  (sample conventions: --mask-convention keep --position-rule reset)\n", ""),
          "the embedded sample and data/sample_batch.npz differ")
    # the step rule reads the same boundaries here
    expect(["inspect", "--position-rule", "step"], 0, out_has=["step rule", "problems: none"])


def case_sample_json():
    rc, out, err = run("inspect", "--json")
    check(rc == 0, "inspect --json exit %d: %s" % (rc, err))
    try:
        d = json.loads(out)
    except ValueError as e:
        check(False, "inspect --json is not JSON: %s\n%s" % (e, out))
        return
    check(d["ok"] is True and d["n_problems"] == 0 and d["problems"] == [], "json ok/problems %r" % d)
    check(d["shape"] == [3, 16] and d["packed"] is False, "json shape")
    check([(s["row"], s["start"], s["length"]) for s in d["segments"]] == SAMPLE_SEGMENTS, "json segments")
    check(d["n_sequences"] == 4 and d["n_tokens"] == 36 and d["longest"] == 12, "json counts")
    check(abs(d["pad_fraction"] - 0.25) < 1e-12, "json pad fraction")
    check(d["rule"]["causal"] is True and d["rule"]["window"] == [-1, -1], "json rule")
    names = [i["name"] for i in d["inputs"]]
    check(names == ["attention_mask", "position_ids", "input_ids", "labels"], "json inputs %r" % names)
    check(d["inputs"][1]["n_sequences"] == 5, "position_ids alone read 5 sequences (left pads included)")


def png_size(path):
    """(width, height) of a PNG after checking its signature and that IHDR comes first."""
    with open(path, "rb") as f:
        data = f.read(24)
    check(data[:8] == b"\x89PNG\r\n\x1a\n", "%s: PNG signature" % path)
    check(data[12:16] == b"IHDR", "%s: IHDR first" % path)
    return struct.unpack(">II", data[16:24])


def pictures_built_in():
    """False when this maskpack was built without cairo (then --png says so: case no_cairo checks it)."""
    rc, out, err = run("inspect", "--png", os.path.join(TMP, "probe.png"))
    return "pictures were not built in" not in out


def svg_texts(path):
    """Every <text> of an SVG (the picture's words), its <g class> groups with their <title>s, and the
    raster images' decoded PNG bytes."""
    import base64
    import xml.etree.ElementTree as ET
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.parse(path).getroot()
    texts = [t.text or "" for t in root.iter(ns + "text")]
    groups = []
    for g in root.iter(ns + "g"):
        title = g.find(ns + "title")
        groups.append((g.get("class"), title.text if title is not None else ""))
    images = []
    for im in root.iter(ns + "image"):
        href = im.get("{http://www.w3.org/1999/xlink}href") or im.get("href") or ""
        images.append(base64.b64decode(href.split(",", 1)[1]) if href.startswith("data:image/png;base64,") else b"")
    return texts, groups, images


def case_png():
    # The sample's picture: drawn by cairo with a title, numbers, labels and a legend (the old one was
    # bare cells, 32 px each, panels stacked: its exact size is no longer pinned, only that it is a
    # valid PNG whose panels sit side by side)
    if not pictures_built_in():
        return
    path = os.path.join(TMP, "sample.png")
    out = expect(["inspect", "--png", path], 0, out_has=["picture: " + path + " (PNG, 3 of 3 rows)"])
    w, h = png_size(path)
    check(w >= 3 * 16 * 20 and 400 <= h <= 2000, "png size %dx%d" % (w, h))
    expect(["inspect", "--png", path, "--png-rows", "1", "--png-zoom", "2"], 0)
    w1, h1 = png_size(path)
    check(w1 < w and h1 < h, "one row at zoom 2 is smaller: %dx%d" % (w1, h1))
    # a row the batch does not have: nothing drawn, the reason named
    expect(["inspect", "--png", path, "--png-rows", "7"], 1,
           out_has=["png: nothing written to %s: --png-rows: row 7 is not a row of this batch (it has rows 0 to 2)"
                    % path])
    # the same picture as SVG, by --svg or by the name: its words are text
    for args in (["--svg", os.path.join(TMP, "sample_svg")], ["--png", os.path.join(TMP, "sample.svg")]):
        expect(["inspect"] + args, 0, out_has=["(SVG, 3 of 3 rows)"])
        texts, groups, images = svg_texts(args[1])
        words = "\n".join(texts)
        for want in ["Which keys each query attends to: sample batch (embedded)",      # title: the file
                     "rule: causal, bottom_right alignment, no window",               # the rule
                     "attention_mask (2D keep mask)", "position_ids (reset rule)",     # the conventions
                     "key token (column)", "query token (row)",                        # axis labels
                     "batch row 0", "batch row 2", "Legend", "allowed:", "masked by the rule:",
                     "another sequence:", "padding:", "Problems: none"]:
            check(want in words, "sample SVG lacks the text %r" % want)
        for k in range(4):
            check("seq %d" % k in texts, "sample SVG: sequence %d is not labelled" % k)
        for n in ("0", "7", "15"):
            check(texts.count(n) >= 6, "sample SVG: column/row number %s not on both axes of 3 panels" % n)
        check([c for c, _ in groups].count("problem-marker") == 0, "the sample has no problem to mark")
        check(len(images) == 3 and all(png_dims(i) == (16, 16) for i in images), "one 16 x 16 cell raster per row")


def png_dims(data):
    return struct.unpack(">II", data[16:24]) if data[:8] == b"\x89PNG\r\n\x1a\n" else None


def case_picture_problems():
    """Every problem the report lists is in the picture's list; each one tied to a token is marked in
    its row's panel (an SVG group per marker, titled with the problem)."""
    if not pictures_built_in():
        return
    f1 = os.path.join(TMP, "mixed.npz")
    npz(f1, {
        "attention_mask": ("i8", (2, 8), [1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0]),
        "position_ids": ("i8", (2, 8), [0, 1, 2, 3, 0, 1, 0, 0, 0, 1, 0, 1, 2, 3, 4, 0]),
        "cu_seqlens": ("i4", (4,), [0, 2, 6, 15]),
        "labels": ("i8", (2, 8), [1, 2, 3, 4, 5, 6, 7, -100, 1, 2, 3, 4, 5, 6, 7, -100]),
    })
    flags = ["--mask-convention", "keep", "--position-rule", "reset", "--cu-form", "te"]
    svg = os.path.join(TMP, "mixed.svg")
    rc, out, err = run("inspect", f1, *flags, "--json", "--svg", svg)
    problems = json.loads(out)["problems"]
    check(rc == 1 and len(problems) == 5, "mixed batch: 5 problems, got %r" % problems)
    texts, groups, _ = svg_texts(svg)
    words = "\n".join(texts)
    markers = [t for c, t in groups if c == "problem-marker"]
    listed = [t for c, t in groups if c == "problem"]
    check(len(listed) == len(problems), "a list entry per problem: %r" % listed)
    check(len(markers) == len(problems), "a marker per problem (each is tied to a token here): %r" % markers)
    for i, p in enumerate(problems):
        check("problem %d: %s" % (i + 1, p) in markers, "problem %d not marked: %r" % (i + 1, p))
        check(p[:60] in words, "problem %d not written in the picture: %r" % (i + 1, p))
    check("Problems (5), numbered as their markers:" in words, "the problem list's heading")
    # the PNG of the same batch draws too
    png = os.path.join(TMP, "mixed.png")
    expect(["inspect", f1] + flags + ["--png", png], 1, out_has=["picture: " + png])
    png_size(png)
    # a problem not tied to a token (a grid disagreement) is listed and said not to be marked
    f5 = os.path.join(TMP, "shapes_pic.npz")
    npz(f5, {"attention_mask": ("i8", (1, 4), [1, 1, 1, 0]), "labels": ("i8", (1, 5), [1, 2, 3, 4, 5])})
    expect(["inspect", f5, "--mask-convention", "keep", "--svg", svg], 1)
    texts, groups, _ = svg_texts(svg)
    check([c for c, _ in groups].count("problem") == 1 and [c for c, _ in groups].count("problem-marker") == 0,
          "an untied problem: listed, not marked")
    check(any("not tied to a token" in t for t in texts), "the untied problem says it is not marked")


def case_picture_blocks():
    """A row of more than 512 tokens is drawn at block resolution: each cell a block of tokens, the
    legend says the block size; --png-block chooses it; bad values are refused."""
    if not pictures_built_in():
        return
    big = os.path.join(TMP, "big.npz")
    S = 3000
    pos = list(range(1000)) + list(range(1600)) + [0] * 400
    npz(big, {"attention_mask": ("i8", (1, S), [1] * 2600 + [0] * 400), "position_ids": ("i8", (1, S), pos)})
    flags = ["--mask-convention", "keep", "--position-rule", "reset"]
    svg = os.path.join(TMP, "big.svg")
    expect(["inspect", big] + flags + ["--svg", svg], 0)
    texts, groups, images = svg_texts(svg)
    words = "\n".join(texts)
    # 3000 tokens: blocks of 8 (the smallest power of two leaving at most 512 cells: 375 a side)
    check(len(images) == 1 and png_dims(images[0]) == (375, 375), "block raster %r" % [png_dims(i) for i in images])
    for want in ["each cell is a block of 8 x 8 tokens", "block size: 8 tokens", "partly allowed:",
                 "key tokens (columns, by block)", "query tokens (rows, by block)", "seq 0", "seq 1"]:
        check(want in words, "block SVG lacks %r" % want)
    expect(["inspect", big] + flags + ["--svg", svg, "--png-block", "100"], 0)
    texts, _, images = svg_texts(svg)
    check(png_dims(images[0]) == (30, 30) and any("block of 100 x 100 tokens" in t for t in texts), "--png-block 100")
    png = os.path.join(TMP, "big.png")
    expect(["inspect", big] + flags + ["--png", png], 0)
    w, h = png_size(png)
    check(w < 2000 and h < 2000, "block picture size %dx%d" % (w, h))
    # one token per cell on request: 3000 cells is more than 2048 a side: refused with the block to use
    expect(["inspect", big] + flags + ["--png", png, "--png-block", "1"], 1,
           out_has=["--png-block 1 leaves 3000 x 3000 cells per row, more than 2048 a side; use a block of at least 2"])
    # 375 cells of 32 pixels a side: 12000 x 12000 pixels is more than a PNG here holds; the SVG is not
    # limited (its cells are one 375 x 375 raster)
    out = expect(["inspect", big] + flags + ["--png", png, "--png-zoom", "32"], 1,
                 out_has=["more than a PNG here holds (32767 a side, 64 Mpixel); draw fewer rows, or write an .svg"])
    check("picture: " not in out, "a refused picture is not reported as written")
    rc, out, err = run("inspect", big, *flags, "--svg", svg, "--png-zoom", "32", "--json")
    check(rc == 0 and json.loads(out).get("picture") == svg, "the SVG at zoom 32, named in the JSON report: %r" % out[-200:])
    expect(["inspect", big] + flags + ["--png", png, "--png-block", "0"], 2,
           err_has=["--png-block: expected a block of tokens in [1, 2^40], found '0'"])
    expect(["inspect", big] + flags + ["--png-block", "8"], 2, err_has=["--png-block applies to a picture"])
    expect(["inspect", "--png", png, "--svg", svg], 2, err_has=["one picture per run"])


def case_reconciled():
    """The sample's report says in words how its inputs were reconciled: which input decides which
    tokens are real, which one where sequences start, what each input alone reads and why that
    differs from the result (the 3, 5 and 4 of the old report, unexplained)."""
    out = expect(["inspect"], 0, out_has=[
        "attention_mask     int64    [3, 16]        2D keep mask                   -> alone: 3 sequences, 36 tokens",
        "how the inputs were reconciled:",
        "which tokens are real: attention_mask decides (it marks every real token 1 and every pad token 0).",
        "where sequences start: position_ids (a position that drops back to its minimum (0) starts a sequence).",
        "attention_mask (2D keep mask) read alone: 3 sequences, 36 tokens. It differs from the result because it "
        "cannot mark where two sequences packed in one row meet: it reads 1 pair of neighbouring sequences as one "
        "(first: row 1, column 7",
        "position_ids (reset rule) read alone: 5 sequences, 40 tokens. It differs from the result because it cannot "
        "mark left padding: 4 pad tokens (first: row 2, columns 0-3) read as tokens, which make 1 extra "
        "sequence of padding only.",
        "result: 4 sequences over 36 real tokens: the real tokens attention_mask says, split where any input starts "
        "a sequence.",
        "problems: none (every input agrees with the others)"])
    check(out.index("how the inputs were reconciled:") < out.index("sequences: 4, longest: 12"), "reconciliation first")
    # an input that agrees with the result says so
    f = os.path.join(TMP, "agree.npz")
    npz(f, {"attention_mask": ("i8", (1, 4), [1, 1, 1, 1]), "position_ids": ("i8", (1, 4), [0, 1, 2, 3])})
    expect(["inspect", f, "--mask-convention", "keep", "--position-rule", "reset"], 0,
           out_has=["attention_mask (2D keep mask) read alone: 1 sequence, 4 tokens: the same as the result.",
                    "position_ids (reset rule) read alone: 1 sequence, 4 tokens: the same as the result."])
    # a single 0 after the real tokens: position_ids read it as a one-token sequence, the mask as padding
    npz(f, {"attention_mask": ("i8", (1, 4), [1, 1, 1, 0]), "position_ids": ("i8", (1, 4), [0, 1, 2, 0])})
    expect(["inspect", f, "--mask-convention", "keep", "--position-rule", "reset"], 0,
           out_has=["position_ids (reset rule) read alone: 2 sequences, 4 tokens. It differs from the result because "
                    "it cannot mark this padding: 1 pad token (first: row 0, column 3) read as tokens, which make 1 "
                    "extra sequence of padding only."])


def case_no_cairo():
    """Built without cairo (meson -Dcairo=disabled), every picture is refused saying so, nothing crashes
    and the report is still printed; with cairo this case has nothing to check."""
    if pictures_built_in():
        return
    path = os.path.join(TMP, "never.png")
    expect(["inspect", "--png", path], 1, out_has=["pictures were not built in", "libcairo2-dev", "sequences: 4"])
    lengths = os.path.join(TMP, "nc.txt")
    with open(lengths, "w") as fh:
        fh.write("3\n5\n")
    expect(["plan", lengths, "--capacity", "8", "--png", path], 1, err_has=["pictures were not built in"])
    expect(["cp-sim", "--tokens", "1000", "--ranks", "2", "--png", path], 1, err_has=["pictures were not built in"])
    check(not os.path.exists(path), "a picture was written without cairo")


def case_emit():
    out_npz = os.path.join(TMP, "derived.npz")
    expect(["inspect", "--emit", "all", "--out", out_npz, "--deflate"], 0,
           out_has=["wrote " + out_npz, "cu_seqlens int32 [5]", "mask4d bool [3, 1, 16, 16]"])
    z = read_npz(out_npz)
    check(z["cu_seqlens"] == ((5,), [0, 11, 18, 24, 36]), "cu_seqlens %r" % (z["cu_seqlens"],))
    check(z["cu_seqlens_npu"][1] == [11, 18, 24, 36], "cu_seqlens_npu")
    check(z["cu_seqlens_padded"][1] == [0, 16, 23, 32, 48], "cu_seqlens_padded %r" % (z["cu_seqlens_padded"],))
    shape, pos = z["position_ids"]
    check(shape == (3, 16) and pos[16:32] == list(range(7)) + list(range(6)) + [0, 0, 0], "position_ids row 1")
    check(pos[32:36] == [0, 0, 0, 0] and pos[36:48] == list(range(12)), "position_ids row 2 (left pad)")
    shape, m2 = z["mask2d"]
    check(sum(m2) == 36 and m2[32:36] == [0, 0, 0, 0], "mask2d")
    shape, m4 = z["mask4d"]
    check(shape == (3, 1, 16, 16), "mask4d shape")
    row1 = m4[256:512]
    check(row1[8 * 16 + 7] == 1 and row1[8 * 16 + 6] == 0 and row1[8 * 16 + 9] == 0, "mask4d: documents and causality")
    check(z["segment_ids"][1][16:32] == [2] * 7 + [3] * 6 + [0] * 3, "segment_ids")
    check(z["valid_indices"][1][11] == 16 and len(z["valid_indices"][1]) == 36, "valid_indices")
    check(z["last_token_index"][1] == [10, 22, 28, 47], "last_token_index")
    check("npu_sparse_mode" in z and "block_mask_kv_num_blocks" in z, "npu and block mask outputs")
    # the operator's own spelling, as torch_npu and the Python dict spell it
    check("npu_pre_tockens" in z and "npu_next_tockens" in z and "npu_pre_tokens" not in z, "torch_npu spelling")
    rc, js, err = run("inspect", "--emit", "npu", "--json", "--out", os.path.join(TMP, "npu_only.npz"))
    npu = json.loads(js)["npu"] if rc == 0 else {}
    check("pre_tockens" in npu and "next_tockens" in npu and "pre_tokens" not in npu, "json: torch_npu spelling")
    # additive mask in float32, and the safetensors writer (which takes bfloat16)
    out_st = os.path.join(TMP, "derived.safetensors")
    expect(["inspect", "--emit", "mask4d,cu_seqlens", "--emit-convention", "additive", "--emit-dtype", "bfloat16",
            "--out", out_st], 0, out_has=["mask4d bfloat16 [3, 1, 16, 16]"])
    with open(out_st, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    check(header["mask4d"]["dtype"] == "BF16" and header["mask4d"]["shape"] == [3, 1, 16, 16], "safetensors mask4d")
    check(header["cu_seqlens"]["dtype"] == "I32", "safetensors cu_seqlens")
    # bfloat16 has no .npy form: the npz writer refuses and nothing is claimed written
    expect(["inspect", "--emit", "mask4d", "--emit-convention", "additive", "--emit-dtype", "bfloat16",
            "--out", os.path.join(TMP, "bf16.npz")], 1, out_has=["MASKPACK_ERR_UNSUPPORTED"], out_lacks=["wrote "])


def case_corrupt():
    with open(os.path.join(ROOT, "data", "sample_batch.npz"), "rb") as f:
        data = f.read()
    trunc = os.path.join(TMP, "truncated.npz")
    with open(trunc, "wb") as f:
        f.write(data[:600])
    expect(["inspect", trunc, "--mask-convention", "keep", "--position-rule", "reset"], 1,
           out_has=["MASKPACK_ERR_FORMAT", "end-of-central-directory"])
    # one flipped byte inside the first member's compressed data: the deflate stream or CRC objects
    bad = bytearray(data)
    bad[100] ^= 0x55
    flipped = os.path.join(TMP, "flipped.npz")
    with open(flipped, "wb") as f:
        f.write(bytes(bad))
    out = expect(["inspect", flipped, "--mask-convention", "keep", "--position-rule", "reset", "--json"], 1)
    d = json.loads(out)
    check(d["ok"] is False and any("MASKPACK_ERR_FORMAT" in p for p in d["problems"]), "corrupt file in JSON: %r" % d)
    missing = os.path.join(TMP, "does-not-exist.npz")
    expect(["inspect", missing], 1, out_has=["MASKPACK_ERR_IO", "cannot open"])


def case_usage():
    sample = os.path.join(ROOT, "data", "sample_batch.npz")
    expect(["inspect", "--frobnicate"], 2, err_has=["unknown option '--frobnicate'"])
    expect(["inspect", sample], 2, err_has=["--mask-convention keep"])
    expect(["inspect", sample, "--mask-convention", "keep"], 2, err_has=["--position-rule"])
    expect(["inspect", sample, "--mask-convention", "masked", "--position-rule", "reset"], 2,
           err_has=["a 2D attention_mask is keep or doc_id"])
    expect(["inspect", "--emit", "mask2d"], 2, err_has=["--emit needs --out"])
    expect(["inspect", "--emit", "nonsense", "--out", "x.npz"], 2, err_has=["--emit: expected"])
    expect(["inspect", "--window", "3"], 2, err_has=["--window: expected L,R"])
    expect(["inspect", "a.npz", "b.npz"], 2, err_has=["more than one FILE"])
    bare = os.path.join(TMP, "bare.npy")
    with open(bare, "wb") as f:
        f.write(npy("i4", (3,), [3, 5, 8]))
    expect(["inspect", bare], 2, err_has=["--as"])
    expect(["inspect", sample, "--as", "cu_seqlens"], 2, err_has=["--as applies to a bare .npy"])


def case_inputs():
    # a bare .npy of NPU-form cu_seqlens
    bare = os.path.join(TMP, "cu.npy")
    with open(bare, "wb") as f:
        f.write(npy("i4", (3,), [3, 5, 8]))
    out = expect(["inspect", bare, "--as", "cu_seqlens", "--cu-form", "npu", "--json"], 0)
    d = json.loads(out)
    check(d["packed"] is True and d["shape"] == [8], "packed stream %r" % d.get("shape"))
    check([(s["start"], s["length"]) for s in d["segments"]] == [(0, 3), (3, 2), (5, 3)], "cu segments")
    # the same bytes through standard input ('-'), as from a pipe
    with open(bare, "rb") as f:
        piped = expect(["inspect", "-", "--as", "cu_seqlens", "--cu-form", "npu", "--json"], 0, stdin=f.read())
    check(json.loads(piped)["segments"] == d["segments"], "inspect - reads standard input")
    expect(["inspect", "-", "--as", "cu_seqlens"], 1, stdin=b"not a batch", out_has=["MASKPACK_ERR_FORMAT"])
    # TE form with cu_seqlens_padded (filler between sequences), in a safetensors file
    st = os.path.join(TMP, "padded.safetensors")
    safetensors(st, {"cu_seqlens": ("i4", (4,), [0, 3, 5, 9]), "cu_seqlens_padded": ("i4", (4,), [0, 4, 8, 13])})
    out = expect(["inspect", st, "--cu-form", "te", "--json"], 0)
    d = json.loads(out)
    check(d["shape"] == [13] and [(s["start"], s["length"]) for s in d["segments"]] == [(0, 3), (4, 2), (8, 4)],
          "cu_seqlens_padded segments %r" % d.get("segments"))
    # a 4D M-mask: causal with one left-pad token, rule recovered from the mask
    S = 4
    allowed = [[(i >= 1 and 1 <= j <= i) for j in range(S)] for i in range(S)]
    masked = [0 if allowed[i][j] else 1 for i in range(S) for j in range(S)]
    m4 = os.path.join(TMP, "mask4d.npz")
    npz(m4, {"attention_mask": ("b1", (1, 1, S, S), masked)})
    expect(["inspect", m4, "--mask-convention", "masked"], 0,
           out_has=["4D masked mask", "rule: causal", "from attention_mask (4D)", "problems: none"])
    expect(["inspect", m4, "--mask-convention", "masked", "--bidirectional"], 1,
           out_has=["rule: attention_mask encodes a causal rule, the flags say --bidirectional"])
    # a bare 4D npy with --as mask4d, keep polarity
    keep = [1 - v for v in masked]
    b4 = os.path.join(TMP, "keep4d.npy")
    with open(b4, "wb") as f:
        f.write(npy("u1", (1, 1, S, S), keep))
    expect(["inspect", b4, "--as", "mask4d", "--mask-convention", "keep"], 0, out_has=["sequences: 1, longest: 3"])


def case_disagreements():
    # position_ids (reset) split row 0 at 3; cu_seqlens at 2; labels train on a pad token
    f1 = os.path.join(TMP, "disagree.npz")
    npz(f1, {
        "attention_mask": ("i8", (1, 8), [1, 1, 1, 1, 1, 1, 0, 0]),
        "position_ids": ("i8", (1, 8), [0, 1, 2, 0, 1, 2, 0, 0]),
        "cu_seqlens": ("i4", (3,), [0, 2, 6]),
        "labels": ("i8", (1, 8), [5, 5, 5, 5, 5, 5, 7, -100]),
        "input_ids": ("i8", (1, 8), [5, 5, 5, 5, 5, 5, 0, 9]),  # pad ids differing is NOT a problem
    })
    out = expect(["inspect", f1, "--mask-convention", "keep", "--position-rule", "reset", "--cu-form", "te"], 1,
                 out_has=["row 0: cu_seqlens says 2 sequences, position_ids says 2 (they split differently at column 2)",
                          "row 0: labels are not -100 on 1 pad token (first at column 6: 7)"])
    check("input_ids" not in out.split("problems")[1], "input_ids of pad tokens are not a problem")
    # the brief's example: a doc-id mask says 2 sequences, position_ids say 3
    f2 = os.path.join(TMP, "docid.npz")
    npz(f2, {
        "attention_mask": ("i4", (2, 8), [1, 1, 1, 2, 2, 2, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]),
        "position_ids": ("i4", (2, 8), [0, 1, 0, 0, 1, 2, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0]),
    }, deflate=False)
    out = expect(["inspect", f2, "--mask-convention", "doc_id", "--position-rule", "reset", "--json"], 1)
    d = json.loads(out)
    check(d["problems"] == ["row 0: attention_mask says 2 sequences, position_ids says 3 (they split differently "
                            "at column 2)"], "doc_id vs position_ids problems %r" % d["problems"])
    # the step rule does not see the repeated 0 at column 3 as a second boundary either: still 3
    out = expect(["inspect", f2, "--mask-convention", "doc_id", "--position-rule", "step", "--json"], 1)
    d = json.loads(out)
    check(d["problems"] == ["row 0: attention_mask says 2 sequences, position_ids says 3 (they split differently "
                            "at column 2)"], "doc_id vs position_ids (step) problems %r" % d["problems"])
    # position_ids that call real tokens padding (a zero tail under the mask's ones)
    f3 = os.path.join(TMP, "tail.npz")
    npz(f3, {"attention_mask": ("i8", (1, 6), [1, 1, 1, 1, 1, 1]), "position_ids": ("i8", (1, 6), [0, 1, 2, 3, 0, 0])})
    expect(["inspect", f3, "--mask-convention", "keep", "--position-rule", "step"], 1,
           out_has=["row 0: position_ids end in a run of zeros read as padding from column 4, but attention_mask "
                    "marks 2 of those tokens as real"])
    # a constructor failure: a keep mask with a hole; the library's message is shown
    f4 = os.path.join(TMP, "hole.npz")
    npz(f4, {"attention_mask": ("i8", (1, 5), [1, 0, 1, 1, 0])})
    expect(["inspect", f4, "--mask-convention", "keep"], 1, out_has=["attention_mask: MASKPACK_ERR_HOLE"])
    # a grid disagreement
    f5 = os.path.join(TMP, "shapes.npz")
    npz(f5, {"attention_mask": ("i8", (1, 4), [1, 1, 1, 1]), "labels": ("i8", (1, 5), [1, 2, 3, 4, 5])})
    expect(["inspect", f5, "--mask-convention", "keep"], 1, out_has=["shape: labels [1, 5] implies a [1, 5] token grid"])
    # problems block --emit
    expect(["inspect", f1, "--mask-convention", "keep", "--position-rule", "reset", "--cu-form", "te",
            "--emit", "mask2d", "--out", os.path.join(TMP, "never.npz")], 1, out_has=["nothing written"])
    check(not os.path.exists(os.path.join(TMP, "never.npz")), "--out written despite problems")


def case_hostile():
    """Hostile inputs: a specific problem, fast, nothing crashed, nothing written or removed."""
    # a 24-byte cu_seqlens claiming 2^61 (or 2^62 + 1) tokens: the per-token grid B * S * 8 bytes
    # wrapped to 0 and the analysis wrote past a malloc(0) (SIGSEGV); now refused against the budget
    for end in (2 ** 61, 2 ** 62 + 1):
        f = os.path.join(TMP, "huge_cu_%d.npy" % end)
        with open(f, "wb") as fh:
            fh.write(npy("i8", (2,), [0, end]))
        expect(["inspect", f, "--as", "cu_seqlens", "--cu-form", "te"], 1,
               out_has=["cu_seqlens: the token grid [1, %d] is too large" % end, "4294967296 bytes (--max-bytes)"])
        f = os.path.join(TMP, "huge_cu_%d.npz" % end)
        npz(f, {"cu_seqlens": ("i8", (2,), [0, end])})
        expect(["inspect", f, "--cu-form", "te"], 1, out_has=["the token grid [1, %d] is too large" % end])
    # the budget is the user's: a small grid under a smaller --max-bytes is refused the same way
    f = os.path.join(TMP, "small_cu.npy")
    with open(f, "wb") as fh:
        fh.write(npy("i8", (3,), [0, 3, 20]))  # 88 bytes; the analysis needs 20 * 8 bytes
    expect(["inspect", f, "--as", "cu_seqlens", "--cu-form", "te"], 0)
    expect(["inspect", f, "--as", "cu_seqlens", "--cu-form", "te", "--max-bytes", "159"], 1,
           out_has=["token grid [1, 20] is too large", "budget of 159 bytes"])
    expect(["inspect", f, "--as", "cu_seqlens", "--cu-form", "te", "--max-bytes", "160"], 0)
    # the outputs count against the budget too: a [1, 20, 20] mask4d of 400 bytes does not fit 300
    expect(["inspect", f, "--as", "cu_seqlens", "--cu-form", "te", "--max-bytes", "300", "--emit", "mask4d", "--out",
            os.path.join(TMP, "m4.npz")], 1, out_has=["emit mask4d: cannot allocate the output (larger than the "
                                                       "memory budget of 300 bytes (--max-bytes)"])
    check(not os.path.exists(os.path.join(TMP, "m4.npz")), "--out written although an output did not fit")
    expect(["inspect", f, "--as", "cu_seqlens", "--cu-form", "te", "--max-bytes", "0"], 2,
           err_has=["--max-bytes: expected a byte count >= 1"])
    # 128-byte files of shape (2^33, 0): nothing to read, so an empty analysis at once (every row was
    # visited: still running after 20 s)
    def header_only(name, descr, shape):
        h = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, ", ".join(map(str, shape)))
        h += " " * (-(10 + len(h) + 1) % 64) + "\n"
        f = os.path.join(TMP, name)
        with open(f, "wb") as fh:
            fh.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
        return f
    rows = 2 ** 33
    for name, descr, shape, flags in [
            ("zm.npy", "|i1", (rows, 0), ["--as", "attention_mask", "--mask-convention", "keep"]),
            ("zd.npy", "|i1", (rows, 0), ["--as", "attention_mask", "--mask-convention", "doc_id"]),
            ("zp.npy", "<i8", (rows, 0), ["--as", "position_ids", "--position-rule", "reset"]),
            ("zp3.npy", "<i8", (3, rows, 0), ["--as", "position_ids", "--position-rule", "step"]),
            ("z4.npy", "|b1", (rows, 1, 0, 0), ["--as", "mask4d", "--mask-convention", "keep"])]:
        f = header_only(name, descr, shape)
        expect(["inspect", f] + flags, 0, out_has=["(%d rows x 0 columns)" % rows, "tokens: 0 of 0"], timeout=10)
    # a failed --out write never destroys: a link to a full device reports the error and stays (it
    # was removed; as root --out /dev/full removed the device), an existing file keeps its bytes
    full = os.path.join(TMP, "full.npz")
    os.symlink("/dev/full", full)
    expect(["inspect", "--emit", "cu_seqlens", "--out", full], 1, out_has=["write failed", "No space left"])
    check(os.path.islink(full), "--out: the link to /dev/full was removed after a failed write")
    check(os.path.exists("/dev/full"), "/dev/full is gone")
    lengths = os.path.join(TMP, "lengths.txt")
    with open(lengths, "w") as fh:
        fh.write("3\n5\n2\n")
    for flag in ("--png", "--json-out"):
        expect(["plan", lengths, "--capacity", "8", flag, full], 1, err_has=["No space left"])
        check(os.path.islink(full), "plan %s: the link to /dev/full was removed after a failed write" % flag)
    old = os.path.join(TMP, "old.npz")
    with open(old, "wb") as fh:
        fh.write(b"precious")
    import resource

    def small_files():
        # writes past 4 KiB fail with EFBIG (SIGXFSZ ignored), as on a full disk
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    p = subprocess.run([BIN, "inspect", "--emit", "all", "--out", old], capture_output=True, timeout=60,
                       preexec_fn=small_files)
    check(p.returncode == 1 and b"write failed" in p.stdout, "--out over the size limit: %r" % (p.stdout,))
    with open(old, "rb") as fh:
        check(fh.read() == b"precious", "--out: a failed write changed the existing file")
    check(sorted(os.listdir(TMP)).count("old.npz") == 1 and not any(n.startswith(".old.npz") for n in os.listdir(TMP)),
          "--out: a temporary file was left behind")
    # the memory budget: an archive whose deflated members claim more than --max-bytes is refused
    # before anything is inflated, naming the member, its claim and the budget
    bomb = os.path.join(TMP, "bomb.npz")
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        for name in ("a", "b", "c"):
            h = "{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }" % (8 << 20)
            h += " " * (-(10 + len(h) + 1) % 64) + "\n"
            z.writestr(name + ".npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + bytes(8 << 20))
    check(os.path.getsize(bomb) < 200000, "bomb.npz is not small")
    expect(["inspect", bomb, "--max-bytes", str(20 << 20)], 1,
           out_has=["member 'c.npy' claims 8388736 bytes (25166208 with the members before it), more than the memory "
                    "budget of 20971520 bytes (--max-bytes)"])
    # endless or long streams stop at the budget
    expect(["inspect", "/dev/zero", "--max-bytes", "1000000"], 1,
           out_has=["/dev/zero: more than the memory budget of 1000000 bytes"], timeout=20)
    expect(["inspect", "-", "--max-bytes", "100000"], 1, out_has=["-: more than the memory budget of 100000 bytes"],
           stdin=bytes(300000))
    big = os.path.join(TMP, "big.bin")
    with open(big, "wb") as fh:
        fh.write(bytes(5000))
    expect(["inspect", big, "--max-bytes", "4096"], 1, out_has=["file has 5000 bytes, more than the memory budget of 4096"])
    # control characters in member names are escaped in the text report (a crafted name could move
    # the cursor or fake report lines); the JSON report escapes them by JSON's rules
    evil = os.path.join(TMP, "evil.npz")
    npz(evil, {"attention_mask": ("i4", (1, 3), [1, 1, 0]), "x\x1b[2J\nproblems: none\x07": ("i4", (1,), [0])})
    out = expect(["inspect", evil, "--mask-convention", "keep"], 0, out_has=["x\\x1b[2J\\nproblems: none\\x07"])
    check("\x1b" not in out and "\x07" not in out, "raw control characters in the text report")
    # (the line now says why there are none: "problems: none (every input agrees with the others)")
    check([l for l in out.split("\n") if l.startswith("problems")] == ["problems: none (every input agrees with the others)"],
          "a member name faked a report line")
    # an .npz holding both 'x' and 'x.npy' is refused (the first one silently won)
    dup = os.path.join(TMP, "dup.npz")
    with zipfile.ZipFile(dup, "w") as z:
        z.writestr("attention_mask.npy", npy("i4", (1, 3), [1, 1, 0]))
        z.writestr("attention_mask", npy("i4", (1, 3), [1, 0, 0]))
    expect(["inspect", dup, "--mask-convention", "keep"], 1,
           out_has=["members 'attention_mask.npy' and 'attention_mask' both hold the array 'attention_mask'"])


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    global BIN, ROOT, TMP
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    BIN, ROOT = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or sorted(CASES)
    with tempfile.TemporaryDirectory(prefix="maskpack_cli_") as tmp:
        TMP = tmp
        for name in names:
            CASES[name]()
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("cli tests passed: %s" % ", ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
