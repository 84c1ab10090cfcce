"""Compares an A/B run of two rgk-bench binaries (`run.sh ab`): runs A1, B1, B2, A2 with
`--no-alternatives` on the same inputs; prints each row's times, the mean difference, whether
the outputs' bit digests agree across all four runs, and the rows that moved by more than
3 % and 0.1 µs. Usage: python3 bench/ab_compare.py DIR (DIR holds A1.log, A1.json, ...)."""
import json,re,sys
d=sys.argv[1]
def load(tag):
    bits=[re.search(r'bits ([0-9a-f]+)',l).group(1) for l in open(f'{d}/{tag}.log') if ' bits ' in l and 'verified=' in l]
    rows=json.load(open(f'{d}/{tag}.json'))['rows']
    su=json.load(open(f'{d}/{tag}.json')).get('startup_ms')
    return bits,rows,su
A1,B1,B2,A2=[load(t) for t in ['A1','B1','B2','A2']]
print('startup_ms base',A1[2],A2[2],'new',B1[2],B2[2])
print('| op | workload | dtype | base µs (A1, A2) | new µs (B1, B2) | Δ | Δ% | outputs |')
print('|---|---|---|---|---|---|---|---|')
bad=0
for i,r in enumerate(A1[1]):
    a=[A1[1][i]['ours_ms']*1e3,A2[1][i]['ours_ms']*1e3]; b=[B1[1][i]['ours_ms']*1e3,B2[1][i]['ours_ms']*1e3]
    for x in (A2,B1,B2): assert x[1][i]['workload']==r['workload'] and x[1][i]['dtype']==r['dtype']
    # A base bench older than the digests prints none: compare the two new runs only.
    digests=[x[0][i] for x in (A1,A2,B1,B2) if i < len(x[0])]
    same = len(set(digests))==1
    outputs = ('bitwise' if same else 'DIFFER') if len(digests)==4 else ('B1=B2' if same else 'B1≠B2') + ', no base digest'
    da=sum(a)/2; db=sum(b)/2; dd=db-da
    flag='' if (abs(dd)<=0.1 or abs(dd)/da<=0.03) else ' **'
    if flag: bad+=1
    print(f"| {r['op']} | {r['workload']} | {r['dtype']} | {a[0]:.2f}, {a[1]:.2f} | {b[0]:.2f}, {b[1]:.2f} | {dd:+.2f}{flag} | {100*dd/da:+.1f}% | {outputs} |")
print('rows beyond 3 % and 0.1 µs:',bad)
