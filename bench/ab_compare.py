"""Compares A/B runs of rgk-bench binaries on the same inputs (`--no-alternatives`).

`python3 bench/ab_compare.py DIR`: the `run.sh ab` layout, A1 B1 B2 A2 (base, new, new, base):
each row's times, the mean difference, whether the outputs' bit digests agree across all four
runs, and the rows that moved by more than 3 % and 0.1 µs.

`python3 bench/ab_compare.py --runs DIR`: the `run.sh abn` layout, runs `NN-TAG.json` /
`NN-TAG.log` in order NN (any tags, any order such as `cur D D cur`): per row each tag's times
in run order, its rel. L2 error, and whether each tag's output digests equal those of the first
tag that printed any.
"""
import json, os, re, sys


def load(path):
    log = open(path + '.log').read().splitlines()
    bits = [re.search(r'bits ([0-9a-f]+)', l).group(1) for l in log if ' bits ' in l and 'verified=' in l]
    doc = json.load(open(path + '.json'))
    return bits, doc['rows'], doc.get('startup_ms')


def pairs(d):
    A1, B1, B2, A2 = [load(f'{d}/{t}') for t in ['A1', 'B1', 'B2', 'A2']]
    print('startup_ms base', A1[2], A2[2], 'new', B1[2], B2[2])
    print('| op | workload | dtype | base µs (A1, A2) | new µs (B1, B2) | Δ | Δ% | outputs |')
    print('|---|---|---|---|---|---|---|---|')
    bad = 0
    for i, r in enumerate(A1[1]):
        a = [A1[1][i]['ours_ms'] * 1e3, A2[1][i]['ours_ms'] * 1e3]
        b = [B1[1][i]['ours_ms'] * 1e3, B2[1][i]['ours_ms'] * 1e3]
        for x in (A2, B1, B2):
            assert x[1][i]['workload'] == r['workload'] and x[1][i]['dtype'] == r['dtype']
        # A base bench older than the digests prints none: compare the two new runs only.
        digests = [x[0][i] for x in (A1, A2, B1, B2) if i < len(x[0])]
        same = len(set(digests)) == 1
        outputs = ('bitwise' if same else 'DIFFER') if len(digests) == 4 else ('B1=B2' if same else 'B1≠B2') + ', no base digest'
        da = sum(a) / 2
        db = sum(b) / 2
        dd = db - da
        flag = '' if (abs(dd) <= 0.1 or abs(dd) / da <= 0.03) else ' **'
        if flag:
            bad += 1
        print(f"| {r['op']} | {r['workload']} | {r['dtype']} | {a[0]:.2f}, {a[1]:.2f} | {b[0]:.2f}, {b[1]:.2f} | {dd:+.2f}{flag} | {100*dd/da:+.1f}% | {outputs} |")
    print('rows beyond 3 % and 0.1 µs:', bad)


def runs(d):
    if not os.path.isdir(d):
        sys.exit(f'{d}: not a directory')
    names = sorted((f[:-5] for f in os.listdir(d) if re.fullmatch(r'\d+-[\w-]+\.json', f)), key=lambda n: int(n.split('-')[0]))
    if not names:
        sys.exit(f'{d}: no NN-TAG.json runs')
    tags = []
    for n in names:
        t = n.split('-', 1)[1]
        if t not in tags:
            tags.append(t)
    # Rows by (op, workload, dtype), in the first run's order, then any the others add.
    data, keys = {}, []
    for n in names:
        bits, rows, _ = load(f'{d}/{n}')
        by_key = {}
        for i, r in enumerate(rows):
            k = (r['op'], r['workload'], r['dtype'])
            by_key[k] = (r, bits[i] if i < len(bits) else None)
            if k not in keys:
                keys.append(k)
        data[n] = by_key
    print('| op | workload | dtype | ' + ' | '.join(f'{t} µs (rel. L2)' for t in tags) + ' | outputs |')
    print('|---|---|---|' + '---|' * len(tags) + '---|')
    for k in keys:
        cells, digest = [], {}
        for t in tags:
            times, errs = [], set()
            for n in names:
                if n.split('-', 1)[1] != t or k not in data[n]:
                    continue
                row, bits = data[n][k]
                times.append(f"{row['ours_ms'] * 1e3:.2f}")
                if row.get('rel_l2_err') is not None:
                    errs.add(f"{row['rel_l2_err']:.2e}")
                if bits is not None:
                    digest.setdefault(t, set()).add(bits)
            cells.append((' / '.join(times) or '—') + (f" ({', '.join(sorted(errs))})" if errs else ''))
        # Against the first tag that printed digests (an older base bench prints none).
        ref_tag = next((t for t in tags if t in digest), None)
        if ref_tag is None:
            outputs = 'no digests'
        else:
            ref = digest[ref_tag]
            differ = [t for t in tags if t in digest and (len(digest[t]) != 1 or digest[t] != ref)]
            missing = [t for t in tags if t not in digest]
            outputs = ('bitwise equal' if not differ else f'differ from {ref_tag}: ' + ', '.join(differ)) + (
                f"; no digest: {', '.join(missing)}" if missing else '')
        print(f'| {k[0]} | {k[1]} | {k[2]} | ' + ' | '.join(cells) + f' | {outputs} |')


if __name__ == '__main__':
    if len(sys.argv) == 3 and sys.argv[1] == '--runs':
        runs(sys.argv[2])
    elif len(sys.argv) == 2 and not sys.argv[1].startswith('-') and os.path.isdir(sys.argv[1]):
        pairs(sys.argv[1])
    else:
        sys.exit(__doc__)
