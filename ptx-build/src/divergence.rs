//! A check of the synchronisation structure of a PTX module: every warp-collective instruction
//! (`shfl.sync`, `vote.sync`, `mma.sync`, …) must be executed by all lanes of a warp the same
//! number of times, and every CTA barrier (`bar.sync`) by all threads of the block. The Rust
//! source can look right while LLVM moves a collective into a branch (a `pure` inline-asm
//! shuffle whose result is only used under `if lane == 0` was sunk into that branch: the kernel
//! then deadlocked on the GPU), so the check runs on the PTX the library embeds.
//!
//! Method (a conservative divergence analysis):
//! - every register gets a uniformity level: block-uniform < warp-uniform < lane-varying.
//!   `%laneid`, `%tid.x` are lane-varying, except `%tid.x >> s` (s ≥ 5) and comparisons of
//!   `%tid.x` against a constant at a warp boundary, which are warp-uniform; `%tid.y/z` are
//!   warp-uniform (every launch here has `blockDim.x % 32 == 0`); `%ctaid`, `%ntid`, params are
//!   block-uniform. Results take the highest level of their operands (loads: of the address);
//!   shuffle results are lane-varying (conservative). Registers defined inside the divergent
//!   region of a non-uniform branch take at least the branch's level (sync dependence).
//! - a conditional branch of level ≥ warp-uniform has a divergent region: the blocks reachable
//!   from its successors before its immediate post-dominator (the reconvergence point). For a
//!   lane-varying branch, every path through the region must carry the same sequence of warp
//!   collectives (LLVM may duplicate a shuffle into both arms, which sm_70+ allows), and no loop
//!   in the region may contain one; for any non-uniform branch, the same for CTA barriers.
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lvl {
    Block = 0,
    Warp = 1,
    Lane = 2,
}

#[derive(Debug)]
struct Insn {
    line: usize,
    /// guard predicate register (`@%p` / `@!%p`), if any
    guard: Option<String>,
    op: String,
    /// destination registers
    dst: Vec<String>,
    /// source registers (and special registers)
    src: Vec<String>,
    /// immediate operands (for the `%tid.x` special cases)
    imms: Vec<i64>,
    /// branch target label
    target: Option<String>,
}

struct Block {
    insns: Vec<Insn>,
    succ: Vec<usize>,
}

fn split_top(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for ch in s.chars() {
        match ch {
            '{' | '[' | '(' => {
                depth += 1;
                cur.push(ch)
            }
            '}' | ']' | ')' => {
                depth -= 1;
                cur.push(ch)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(ch),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

fn regs(s: &str) -> Vec<String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let mut j = i + 1;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b'.') {
                j += 1;
            }
            out.push(s[i..j].trim_end_matches('.').to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

fn imm(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

fn no_dst(op: &str) -> bool {
    ["st.", "st ", "prefetch", "bar.", "barrier", "bra", "red.", "membar", "fence", "trap", "call", "ret", "exit"]
        .iter()
        .any(|p| op.starts_with(p.trim_end()))
        || op == "st"
}

/// The statements of one PTX line without its comment: a one-line inline-asm scope
/// `{ .reg .pred p; setp…; @p mov…; }` gives its inner statements (each with its `;`), any
/// other line itself. Without this a scope line, which does not end in `;`, would swallow the
/// next line's instruction (or label) into one unparsable statement.
fn statements(raw: &str) -> Vec<String> {
    let l = raw.split("//").next().unwrap().trim();
    match l.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        Some(inner) => inner.split(';').map(str::trim).filter(|t| !t.is_empty()).map(|t| format!("{t};")).collect(),
        None => vec![l.to_string()],
    }
}

/// Parses the body of one `.entry` (the lines between its `{` and `}`) into instructions and
/// labels.
fn parse_body(lines: &[(usize, &str)]) -> Vec<(Option<String>, Option<Insn>)> {
    let mut out = Vec::new();
    let mut acc = String::new();
    let mut acc_line = 0;
    for (ln, stmt) in lines.iter().flat_map(|&(ln, raw)| statements(raw).into_iter().map(move |t| (ln, t))) {
        let l = stmt.as_str();
        if l.is_empty() || l == "{" || l == "}" {
            continue;
        }
        if acc.is_empty() {
            if let Some(lbl) = l.strip_suffix(':') {
                out.push((Some(lbl.to_string()), None));
                continue;
            }
            if l.starts_with('.') {
                continue; // .reg / .shared / .local declarations
            }
            acc_line = ln;
        }
        acc.push_str(l);
        acc.push(' ');
        if !l.ends_with(';') {
            continue;
        }
        let text = std::mem::take(&mut acc);
        let text = text.trim().trim_end_matches(';').trim();
        let (guard, rest) = match text.strip_prefix('@') {
            Some(r) => {
                let (g, rest) = r.split_once(char::is_whitespace).unwrap();
                (Some(g.trim_start_matches('!').to_string()), rest.trim())
            }
            None => (None, text),
        };
        let (op, args) = match rest.split_once(char::is_whitespace) {
            Some((o, a)) => (o.to_string(), a.trim().to_string()),
            None => (rest.to_string(), String::new()),
        };
        let parts = split_top(&args);
        let mut insn =
            Insn { line: acc_line, guard, op: op.clone(), dst: vec![], src: vec![], imms: vec![], target: None };
        if op.starts_with("bra") {
            insn.target = parts.first().cloned();
        } else if no_dst(&op) || parts.is_empty() {
            insn.src = regs(&args);
        } else {
            insn.dst = regs(&parts[0]);
            for p in &parts[1..] {
                insn.src.extend(regs(p));
                if let Some(v) = imm(p) {
                    insn.imms.push(v);
                }
            }
        }
        if let Some(g) = &insn.guard {
            insn.src.push(g.clone());
        }
        out.push((None, Some(insn)));
    }
    out
}

/// Warp collectives (all 32 lanes must take part) and CTA barriers, as event names.
fn warp_event(op: &str) -> bool {
    op.contains(".sync") && !op.starts_with("bar.sync") && !op.starts_with("barrier") && !op.starts_with("bar.red")
}
fn cta_event(op: &str) -> bool {
    op.starts_with("bar.sync")
        || op.starts_with("barrier.sync")
        || op.starts_with("barrier.cta.sync")
        || op.starts_with("bar.red")
}

/// One finding: the kernel line and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// 1-based line of the PTX module.
    pub line: usize,
    pub msg: String,
}

/// Checks one kernel body; returns the findings (empty = the structure is sound).
fn check_kernel(lines: &[(usize, &str)]) -> Vec<Finding> {
    // ---- blocks
    let items = parse_body(lines);
    let mut blocks: Vec<Block> = vec![Block { insns: vec![], succ: vec![] }];
    let mut label_of: HashMap<String, usize> = HashMap::new();
    for (lbl, insn) in items {
        if let Some(l) = lbl {
            if !blocks.last().unwrap().insns.is_empty() {
                blocks.push(Block { insns: vec![], succ: vec![] });
            }
            label_of.insert(l, blocks.len() - 1);
            continue;
        }
        let insn = insn.unwrap();
        let ends = insn.op.starts_with("bra") || insn.op == "ret" || insn.op == "exit";
        blocks.last_mut().unwrap().insns.push(insn);
        if ends {
            blocks.push(Block { insns: vec![], succ: vec![] });
        }
    }
    let n = blocks.len();
    let exit = n; // virtual exit node
    for (b, blk) in blocks.iter_mut().enumerate() {
        let last = blk.insns.last();
        let mut succ = vec![];
        match last {
            Some(i) if i.op.starts_with("bra") => {
                succ.push(label_of[i.target.as_ref().unwrap()]);
                if i.guard.is_some() {
                    succ.push(b + 1);
                }
            }
            Some(i) if i.op == "ret" || i.op == "exit" => {
                succ.push(exit);
                if i.guard.is_some() {
                    succ.push(if b + 1 < n { b + 1 } else { exit });
                }
            }
            _ => succ.push(if b + 1 < n { b + 1 } else { exit }),
        }
        succ.dedup();
        blk.succ = succ;
    }
    // ---- post-dominators (bitsets as Vec<bool>) on the graph with the exit node
    let nn = n + 1;
    let succ_of = |b: usize| -> &[usize] {
        if b == exit {
            &[]
        } else {
            &blocks[b].succ
        }
    };
    let mut pdom: Vec<Vec<bool>> = (0..nn).map(|b| (0..nn).map(|x| b != exit || x == exit).collect()).collect();
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..n).rev() {
            let mut s: Vec<bool> = vec![true; nn];
            for &c in succ_of(b) {
                for x in 0..nn {
                    s[x] &= pdom[c][x];
                }
            }
            s[b] = true;
            if s != pdom[b] {
                pdom[b] = s;
                changed = true;
            }
        }
    }
    let ipdom = |b: usize| -> usize {
        // the strict post-dominator with the largest post-dominator set
        (0..nn).filter(|&x| x != b && pdom[b][x]).max_by_key(|&x| pdom[x].iter().filter(|&&y| y).count()).unwrap()
    };
    let region = |b: usize, stop: usize| -> BTreeSet<usize> {
        let mut seen = BTreeSet::new();
        let mut st: Vec<usize> = succ_of(b).to_vec();
        while let Some(x) = st.pop() {
            if x == stop || x == exit || !seen.insert(x) {
                continue;
            }
            st.extend_from_slice(succ_of(x));
        }
        seen
    };
    // ---- uniformity
    let mut lvl: HashMap<String, Lvl> = HashMap::new();
    let mut is_tidx: BTreeSet<String> = BTreeSet::new();
    let special = |r: &str| -> Option<Lvl> {
        if r == "%laneid" || r == "%tid.x" || r.starts_with("%clock") {
            Some(Lvl::Lane)
        } else if r.starts_with("%tid") || r == "%warpid" {
            Some(Lvl::Warp)
        } else if r.starts_with("%ctaid")
            || r.starts_with("%ntid")
            || r.starts_with("%nctaid")
            || r.starts_with("%envreg")
        {
            Some(Lvl::Block)
        } else {
            None
        }
    };
    let mut forced: HashMap<String, Lvl> = HashMap::new(); // sync dependence
    let mut branch_lvl: BTreeMap<usize, Lvl> = BTreeMap::new();
    loop {
        // flow-insensitive fixpoint over all definitions
        let mut ch = true;
        while ch {
            ch = false;
            for b in &blocks {
                for i in &b.insns {
                    if i.dst.is_empty() {
                        continue;
                    }
                    if i.op.starts_with("mov") && i.src == ["%tid.x"] {
                        is_tidx.insert(i.dst[0].clone());
                    }
                    let get = |r: &String| special(r).unwrap_or_else(|| *lvl.get(r).unwrap_or(&Lvl::Block));
                    let mut l = i.src.iter().map(get).max().unwrap_or(Lvl::Block);
                    let tid_src = i.src.len() == 1 + i.guard.is_some() as usize && is_tidx.contains(&i.src[0]);
                    if tid_src && i.op.starts_with("shr") && i.imms.first().is_some_and(|&s| s >= 5) {
                        l = Lvl::Warp;
                    }
                    if tid_src && i.op.starts_with("setp") {
                        if let Some(&c) = i.imms.first() {
                            let cmp = i.op.split('.').nth(1).unwrap_or("");
                            let at_boundary = match cmp {
                                "lt" | "ge" => c % 32 == 0,
                                "gt" | "le" => (c + 1) % 32 == 0,
                                _ => false,
                            };
                            if at_boundary {
                                l = Lvl::Warp;
                            }
                        }
                    }
                    if i.op.starts_with("shfl") || i.op.starts_with("vote") || i.op.starts_with("activemask") {
                        l = Lvl::Lane;
                    }
                    for d in &i.dst {
                        let l = l.max(*forced.get(d).unwrap_or(&Lvl::Block));
                        let e = lvl.entry(d.clone()).or_insert(Lvl::Block);
                        if l > *e {
                            *e = l;
                            ch = true;
                        }
                    }
                }
            }
        }
        // branch levels and sync dependence
        let mut grew = false;
        for (b, blk) in blocks.iter().enumerate() {
            let Some(last) = blk.insns.last() else { continue };
            let (Some(g), true) = (&last.guard, blk.succ.len() > 1) else { continue };
            let l = special(g).unwrap_or_else(|| *lvl.get(g).unwrap_or(&Lvl::Block));
            if l == Lvl::Block {
                continue;
            }
            branch_lvl.insert(b, l);
            let p = ipdom(b);
            for x in region(b, p) {
                for i in &blocks[x].insns {
                    for d in &i.dst {
                        let e = forced.entry(d.clone()).or_insert(Lvl::Block);
                        if l > *e {
                            *e = l;
                            grew = true;
                        }
                    }
                }
            }
        }
        if !grew {
            break;
        }
    }
    // ---- the check
    let mut findings = BTreeSet::new();
    for (&b, &l) in &branch_lvl {
        let p = ipdom(b);
        let reg = region(b, p);
        let branch_line = blocks[b].insns.last().unwrap().line;
        for (kind, is_ev, min) in
            [("warp collective", warp_event as fn(&str) -> bool, Lvl::Lane), ("CTA barrier", cta_event, Lvl::Warp)]
        {
            if l < min {
                continue;
            }
            let ev = |x: usize| -> Vec<String> {
                blocks[x].insns.iter().filter(|i| is_ev(&i.op)).map(|i| format!("{} {:?}", i.op, i.imms)).collect()
            };
            // SCCs of the region (Tarjan-free: mutual reachability, regions are small)
            let reach = |from: usize| -> BTreeSet<usize> {
                let mut seen = BTreeSet::new();
                let mut st = vec![from];
                while let Some(x) = st.pop() {
                    for &c in succ_of(x) {
                        if reg.contains(&c) && seen.insert(c) {
                            st.push(c);
                        }
                    }
                }
                seen
            };
            let reach_of: BTreeMap<usize, BTreeSet<usize>> = reg.iter().map(|&x| (x, reach(x))).collect();
            for &x in &reg {
                if reach_of[&x].contains(&x) && !ev(x).is_empty() {
                    let line = blocks[x].insns.iter().find(|i| is_ev(&i.op)).unwrap().line;
                    findings.insert(Finding {
                        line,
                        msg: format!("{kind} in a loop whose trip count depends on the branch at line {branch_line} ({l:?}-varying)"),
                    });
                }
            }
            // event sequences from each region node to the reconvergence point; nodes of one SCC
            // carry no events (checked above), so a node's set is the union over its SCC's exits.
            let scc_of = |x: usize| -> BTreeSet<usize> {
                let mut s: BTreeSet<usize> =
                    reach_of[&x].iter().copied().filter(|y| reach_of[y].contains(&x)).collect();
                s.insert(x);
                s
            };
            let mut memo: HashMap<usize, BTreeSet<Vec<String>>> = HashMap::new();
            fn seqs(
                x: usize,
                reg: &BTreeSet<usize>,
                memo: &mut HashMap<usize, BTreeSet<Vec<String>>>,
                scc_of: &dyn Fn(usize) -> BTreeSet<usize>,
                succ_of: &dyn Fn(usize) -> Vec<usize>,
                ev: &dyn Fn(usize) -> Vec<String>,
            ) -> BTreeSet<Vec<String>> {
                if !reg.contains(&x) {
                    return BTreeSet::from([vec![]]);
                }
                if let Some(s) = memo.get(&x) {
                    return s.clone();
                }
                let scc = scc_of(x);
                let mut out = BTreeSet::new();
                if scc.len() > 1 || succ_of(x).contains(&x) {
                    for &y in &scc {
                        for c in succ_of(y) {
                            if !scc.contains(&c) {
                                out.extend(seqs(c, reg, memo, scc_of, succ_of, ev));
                            }
                        }
                    }
                } else {
                    let here = ev(x);
                    for c in succ_of(x) {
                        for mut tail in seqs(c, reg, memo, scc_of, succ_of, ev) {
                            let mut s = here.clone();
                            s.append(&mut tail);
                            out.insert(s);
                        }
                    }
                }
                if out.len() > 64 {
                    out = out.into_iter().take(64).collect();
                }
                memo.insert(x, out.clone());
                out
            }
            let succv = |x: usize| succ_of(x).to_vec();
            let mut all = BTreeSet::new();
            for c in succ_of(b) {
                all.extend(seqs(*c, &reg, &mut memo, &scc_of, &succv, &ev));
            }
            if all.len() > 1 {
                let lines: Vec<usize> =
                    reg.iter().flat_map(|&x| blocks[x].insns.iter().filter(|i| is_ev(&i.op)).map(|i| i.line)).collect();
                findings.insert(Finding {
                    line: lines.first().copied().unwrap_or(branch_line),
                    msg: format!(
                        "{kind} not executed the same way on both sides of the {l:?}-varying branch at line {branch_line} (collectives at lines {lines:?}; paths see {} different sequences)",
                        all.len()
                    ),
                });
            }
        }
    }
    findings.into_iter().collect()
}

/// `(name, [(line number in the PTX, line)])` of every `.entry` in `ptx`.
fn kernels(ptx: &str) -> Vec<(String, Vec<(usize, &str)>)> {
    let lines: Vec<&str> = ptx.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(pos) = lines[i].find(".entry ") {
            let name: String =
                lines[i][pos + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$').collect();
            while lines[i].trim() != "{" {
                i += 1;
            }
            let start = i + 1;
            while lines[i] != "}" {
                i += 1;
            }
            out.push((name, (start..i).map(|j| (j + 1, lines[j])).collect()));
        }
        i += 1;
    }
    out
}

fn check_src(ptx: &str) -> Vec<(String, Vec<Finding>)> {
    kernels(ptx).into_iter().map(|(n, body)| (n, check_kernel(&body))).collect()
}

/// Every `.entry` of `ptx` with its findings (empty: proven).
pub fn check_module(ptx: &str) -> Vec<(String, Vec<Finding>)> {
    check_src(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = ".visible .entry k(\n\t.param .u32 k_param_0\n)\n{\n\t.reg .pred \t%p<9>;\n";

    fn one(body: &str) -> Vec<Finding> {
        let ptx = format!("{HEAD}{body}}}\n");
        let mut r = check_src(&ptx);
        assert_eq!(r.len(), 1);
        r.pop().unwrap().1
    }

    /// The shape of the deadlock seen on the H200 (engram_gate_bwd before the fix): the second
    /// butterfly was sunk into the `lane == 0` block.
    #[test]
    fn checker_flags_a_shuffle_sunk_into_a_lane_branch() {
        let f = one(
            "\tmov.u32 %r1, %laneid;\n\tshfl.sync.bfly.b32 %r2, %r9, 16, 0x1f, 0xffffffff;\n\tsetp.ne.b32 %p1, %r1, 0;\n\t@%p1 bra $L__BB0_2;\n// %bb.1:\n\tshfl.sync.bfly.b32 %r3, %r8, 16, 0x1f, 0xffffffff;\n\tst.shared.b32 [%rd1], %r3;\n$L__BB0_2:\n\tbar.sync 0;\n\tret;\n",
        );
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].msg.contains("warp collective"), "{f:?}");
    }

    /// A one-line inline-asm scope (e.g. a predicated timer read) is read as its statements: the
    /// label and the divergent barrier after it are still seen.
    #[test]
    fn checker_reads_through_one_line_asm_scopes() {
        let f = one(
            "\tmov.u32 %r1, %tid.x;\n\tsetp.gt.u32 %p1, %r1, 95;\n\t{ .reg .pred p; setp.eq.f64 p, %rd3, 0d7FF0DEAD00000001; mov.u64 %rd4, %globaltimer; @p mov.u64 %rd4, 0; }\n$L__BB0_1:\n\t@%p1 bra $L__BB0_2;\n\tbra.uni $L__BB0_3;\n$L__BB0_2:\n\t{ .reg .pred p; setp.eq.f64 p, %rd3, 0d7FF0DEAD00000001; mov.u64 %rd5, %globaltimer; @p mov.u64 %rd5, 0; }\n\tbar.sync 0;\n$L__BB0_3:\n\tret;\n",
        );
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].msg.contains("CTA barrier"), "{f:?}");
    }

    #[test]
    fn checker_accepts_a_shuffle_duplicated_into_both_arms() {
        let f = one(
            "\tmov.u32 %r1, %laneid;\n\tsetp.ge.u32 %p1, %r1, %r7;\n\t@%p1 bra $L__BB0_2;\n// %bb.1:\n\tadd.f32 %r4, %r5, %r6;\n\tshfl.sync.bfly.b32 %r3, %r4, 16, 0x1f, 0xffffffff;\n\tbra.uni $L__BB0_3;\n$L__BB0_2:\n\tshfl.sync.bfly.b32 %r3, %r5, 16, 0x1f, 0xffffffff;\n$L__BB0_3:\n\tst.global.b32 [%rd1], %r3;\n\tret;\n",
        );
        assert!(f.is_empty(), "{f:?}");
    }

    #[test]
    fn checker_flags_a_barrier_under_a_warp_branch_but_not_a_shuffle() {
        // warp index = tid.x >> 5; `if warp < 3 { shuffle }` is fine, `if warp < 3 { bar.sync }` is not
        let ok = one(
            "\tmov.u32 %r1, %tid.x;\n\tshr.u32 %r2, %r1, 5;\n\tsetp.lt.u32 %p1, %r2, 3;\n\t@%p1 bra $L__BB0_2;\n\tbra.uni $L__BB0_3;\n$L__BB0_2:\n\tshfl.sync.bfly.b32 %r3, %r4, 16, 0x1f, 0xffffffff;\n$L__BB0_3:\n\tbar.sync 0;\n\tret;\n",
        );
        assert!(ok.is_empty(), "{ok:?}");
        let bad = one(
            "\tmov.u32 %r1, %tid.x;\n\tsetp.gt.u32 %p1, %r1, 95;\n\t@%p1 bra $L__BB0_2;\n\tbra.uni $L__BB0_3;\n$L__BB0_2:\n\tbar.sync 0;\n$L__BB0_3:\n\tret;\n",
        );
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].msg.contains("CTA barrier"), "{bad:?}");
    }

    #[test]
    fn checker_flags_a_shuffle_in_a_lane_dependent_loop_and_follows_data() {
        // loop c = lane; c < n; c += 32 with a shuffle inside
        let f = one(
            "\tmov.u32 %r1, %laneid;\n\tmov.b32 %r2, %r1;\n$L__BB0_1:\n\tshfl.sync.bfly.b32 %r3, %r4, 1, 0x1f, 0xffffffff;\n\tadd.s32 %r2, %r2, 32;\n\tsetp.lt.u32 %p1, %r2, %r9;\n\t@%p1 bra $L__BB0_1;\n\tret;\n",
        );
        assert!(f.iter().any(|x| x.msg.contains("loop")), "{f:?}");
        // a branch on a value loaded from a lane-dependent address is lane-varying
        let g = one(
            "\tmov.u32 %r1, %laneid;\n\tmul.wide.u32 %rd2, %r1, 4;\n\tadd.s64 %rd3, %rd1, %rd2;\n\tld.global.b32 %r5, [%rd3];\n\tsetp.eq.b32 %p1, %r5, 0;\n\t@%p1 bra $L__BB0_2;\n\tshfl.sync.bfly.b32 %r3, %r4, 1, 0x1f, 0xffffffff;\n$L__BB0_2:\n\tret;\n",
        );
        assert_eq!(g.len(), 1, "{g:?}");
    }
}
