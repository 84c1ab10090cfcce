"""Compares A/B runs of rgk-bench binaries on the same inputs (`--no-alternatives`).

`python3 bench/ab_compare.py --runs DIR`: the `run.sh abn` layout (`run.sh ab` is `abn "base cur
cur base"`), runs `NN-TAG.json` / `NN-TAG.log` in order NN (any tags, any order such as `cur D D
cur`): per row each tag's times in run order, its rel. L2 error, its mean's difference from the
first tag's (marked `**` beyond 3 % and 0.1 µs), whether each tag's output digests equal
those of the first tag that printed any, and the tags whose outputs failed verification there
(a diagnostic build's, by design); then, per tag, how many rows moved beyond both bounds.
"""
import json, os, re, sys


def load(path):
    """A run's output digests (the first `bits` of each workload's `OP NAME: verified=` line,
    None where it prints none; one per row, in the rows' order), rows and start-up time."""
    log = open(path + '.log').read().splitlines()
    bits = []
    for l in log:
        if ': verified=' in l:
            m = re.search(r'bits ([0-9a-f]+)', l)
            bits.append(m.group(1) if m else None)
    doc = json.load(open(path + '.json'))
    return bits, doc['rows'], doc.get('startup_ms')


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
    data, keys, startup = {}, [], {}
    for n in names:
        bits, rows, startup[n] = load(f'{d}/{n}')
        by_key = {}
        for i, r in enumerate(rows):
            k = (r['op'], r['workload'], r['dtype'])
            by_key[k] = (r, bits[i] if i < len(bits) else None)
            if k not in keys:
                keys.append(k)
        data[n] = by_key
    print('startup_ms: ' + ', '.join(f"{n} {startup[n]}" for n in names))
    print('| op | workload | dtype | ' + ' | '.join(f'{t} µs (rel. L2)' for t in tags) + ' | outputs |')
    print('|---|---|---|' + '---|' * len(tags) + '---|')
    moved = {t: 0 for t in tags[1:]}
    for k in keys:
        cells, digest, ref_mean, wrong = [], {}, None, []
        for t in tags:
            times, errs = [], set()
            for n in names:
                if n.split('-', 1)[1] != t or k not in data[n]:
                    continue
                row, bits = data[n][k]
                times.append(row['ours_ms'] * 1e3)
                if row.get('verified') is False and t not in wrong:
                    wrong.append(t)
                if row.get('rel_l2_err') is not None:
                    errs.add(f"{row['rel_l2_err']:.2e}")
                if bits is not None:
                    digest.setdefault(t, set()).add(bits)
            cell = (' / '.join(f'{x:.2f}' for x in times) or '—') + (f" ({', '.join(sorted(errs))})" if errs else '')
            mean = sum(times) / len(times) if times else None
            if t == tags[0]:
                ref_mean = mean
            elif mean is not None and ref_mean:
                dd = mean - ref_mean
                flag = abs(dd) > 0.1 and abs(dd) / ref_mean > 0.03
                moved[t] += flag
                cell += f" Δ {dd:+.2f}{' **' if flag else ''}"
            cells.append(cell)
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
        if wrong:
            outputs += f"; FAILED verification: {', '.join(wrong)}"
        print(f'| {k[0]} | {k[1]} | {k[2]} | ' + ' | '.join(cells) + f' | {outputs} |')
    if moved:
        print(f'rows beyond 3 % and 0.1 µs against {tags[0]}: ' + ', '.join(f'{t} {c}' for t, c in moved.items()))


if __name__ == '__main__':
    if len(sys.argv) == 3 and sys.argv[1] == '--runs':
        runs(sys.argv[2])
    else:
        sys.exit(__doc__)
