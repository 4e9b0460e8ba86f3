//! What a stamped persistent launch did ([`super::persistent::PersistentStep::enable_stamps`]): the
//! time each block's runs spent waiting on counters, bringing x into shared memory, waiting for
//! weight slots and computing, summed per op kind ([`table`]), and a per-block timeline chart
//! ([`timeline_svg`]). Pure functions of the stamps, so they are tested without a GPU.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::persistent::RunStamp;

/// The runs of one op kind, times summed over all runs (nanoseconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindTimes {
    pub runs: usize,
    pub tiles: usize,
    /// Waiting for the producers' counters.
    pub counter_wait: u64,
    /// Copying x into shared memory (and norming it).
    pub x_load: u64,
    /// The math waiting for weight slots to arrive.
    pub weight_wait: u64,
    /// The rest of the run: the math and the epilogues.
    pub compute: u64,
}

impl KindTimes {
    pub fn total(&self) -> u64 {
        self.counter_wait + self.x_load + self.weight_wait + self.compute
    }
}

/// Sums the runs per op kind (`kind_of(op)` names an op's kind, such as `qkv` or `down`). A run
/// whose stamps are missing or out of order (a launch that did not stamp it) counts nothing.
pub fn kind_times(
    runs: &[RunStamp],
    kind_of: &dyn Fn(usize) -> String,
) -> BTreeMap<String, KindTimes> {
    let mut out: BTreeMap<String, KindTimes> = BTreeMap::new();
    for r in runs {
        if !(r.start <= r.waited && r.waited <= r.ready && r.ready <= r.end) || r.start == 0 {
            continue;
        }
        let k = out.entry(kind_of(r.op)).or_default();
        k.runs += 1;
        k.tiles += r.tiles;
        k.counter_wait += r.waited - r.start;
        k.x_load += r.ready - r.waited;
        let busy = r.end - r.ready;
        let weight = r.weight_wait.min(busy);
        k.weight_wait += weight;
        k.compute += busy - weight;
    }
    out
}

/// A Markdown table of [`kind_times`]: per kind the runs, tiles, and each part's time as a share of
/// all the blocks' stamped time.
pub fn table(times: &BTreeMap<String, KindTimes>) -> String {
    let all: u64 = times.values().map(KindTimes::total).sum::<u64>().max(1);
    let pct = |v: u64| format!("{:.1}%", 100.0 * v as f64 / all as f64);
    let mut out = String::from(
        "| op | runs | tiles | counter wait | x load | weight wait | compute | total |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut sum = KindTimes::default();
    for (name, k) in times {
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            k.runs,
            k.tiles,
            pct(k.counter_wait),
            pct(k.x_load),
            pct(k.weight_wait),
            pct(k.compute),
            pct(k.total())
        );
        sum.runs += k.runs;
        sum.tiles += k.tiles;
        sum.counter_wait += k.counter_wait;
        sum.x_load += k.x_load;
        sum.weight_wait += k.weight_wait;
        sum.compute += k.compute;
    }
    let _ = writeln!(
        out,
        "| all | {} | {} | {} | {} | {} | {} | {} |",
        sum.runs,
        sum.tiles,
        pct(sum.counter_wait),
        pct(sum.x_load),
        pct(sum.weight_wait),
        pct(sum.compute),
        pct(sum.total())
    );
    out
}

const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

/// A per-block timeline (SVG): one row a block, each run a bar from its start to its end in its
/// kind's colour, the counter wait drawn pale and the x load mid-tone, over `launches` (each a
/// list of runs; their times share the GPU's global timer, so launches line up in time, and the
/// gaps between them are whatever ran between: other kernels, launch latency).
pub fn timeline_svg(
    launches: &[Vec<RunStamp>],
    kind_of: &dyn Fn(usize) -> String,
    title: &str,
) -> String {
    let runs: Vec<&RunStamp> = launches
        .iter()
        .flatten()
        .filter(|r| r.start > 0 && r.start <= r.waited && r.waited <= r.ready && r.ready <= r.end)
        .collect();
    let (width, row, left, top) = (1400.0f64, 4.0f64, 60.0f64, 40.0f64);
    let blocks = runs.iter().map(|r| r.block + 1).max().unwrap_or(0);
    let t0 = runs.iter().map(|r| r.start).min().unwrap_or(0);
    let t1 = runs
        .iter()
        .map(|r| r.end)
        .max()
        .unwrap_or(t0 + 1)
        .max(t0 + 1);
    let span = (t1 - t0) as f64;
    let x = |t: u64| left + (t - t0) as f64 / span * (width - left - 10.0);
    let mut kinds: Vec<String> = runs.iter().map(|r| kind_of(r.op)).collect();
    kinds.sort();
    kinds.dedup();
    let colour = |k: &str| PALETTE[kinds.iter().position(|n| n == k).unwrap_or(0) % PALETTE.len()];
    let height = top + blocks as f64 * row + 40.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"16\" font-size=\"13\">{}</text>\n\
         <text x=\"{left}\" y=\"32\">{} blocks (rows), {:.1} us across; pale: counter wait, mid: x load, full: weights and math</text>\n",
        escape(title),
        blocks,
        span / 1e3
    );
    // One path per (kind, part), its bars as `M x y h w v h h -w z` segments at 0.1 px: a pass has
    // tens of thousands of runs, and a rect element each made charts of megabytes. Parts under
    // 0.05 px are left out.
    let parts = [0.25, 0.55, 1.0];
    let mut paths: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for r in &runs {
        let y = top + r.block as f64 * row;
        let kind = kinds.iter().position(|n| *n == kind_of(r.op)).unwrap_or(0);
        for (part, (a, b)) in [(r.start, r.waited), (r.waited, r.ready), (r.ready, r.end)]
            .into_iter()
            .enumerate()
        {
            let w = x(b) - x(a);
            if w >= 0.05 {
                let _ = write!(
                    paths.entry((kind, part)).or_default(),
                    "M{:.1} {y:.1}h{w:.1}v{:.1}h-{w:.1}z",
                    x(a),
                    row - 0.5
                );
            }
        }
    }
    for ((kind, part), d) in &paths {
        let _ = writeln!(
            svg,
            "<path fill=\"{}\" fill-opacity=\"{}\" d=\"{d}\"/>",
            colour(&kinds[*kind]),
            parts[*part]
        );
    }
    let legend_y = top + blocks as f64 * row + 20.0;
    for (i, k) in kinds.iter().enumerate() {
        let lx = left + i as f64 * 110.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{lx}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{:.1}\">{}</text>",
            legend_y - 9.0,
            colour(k),
            lx + 14.0,
            legend_y,
            escape(k)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(block: usize, op: usize, t: [u64; 4], weight_wait: u64) -> RunStamp {
        RunStamp {
            block,
            op,
            tiles: 2,
            start: t[0],
            waited: t[1],
            ready: t[2],
            end: t[3],
            weight_wait,
        }
    }

    #[test]
    fn the_parts_of_each_run_are_summed_per_kind_and_unstamped_runs_count_nothing() {
        let runs = [
            run(0, 0, [100, 110, 130, 200], 20),
            run(1, 0, [100, 100, 120, 180], 100),
            run(0, 1, [200, 260, 270, 300], 5),
            run(1, 1, [0, 0, 0, 0], 0),
            run(2, 1, [300, 290, 310, 320], 0),
        ];
        let t = kind_times(&runs, &|op| ["qkv", "o"][op].to_string());
        let qkv = &t["qkv"];
        assert_eq!((qkv.runs, qkv.tiles), (2, 4));
        assert_eq!(qkv.counter_wait, 10);
        assert_eq!(qkv.x_load, 40);
        // The second run's weight wait is capped at its busy time (60).
        assert_eq!(qkv.weight_wait, 80);
        assert_eq!(qkv.compute, 50);
        assert_eq!(qkv.total(), 180);
        assert_eq!(
            t["o"].runs, 1,
            "an unstamped and a disordered run count nothing"
        );
        let md = table(&t);
        assert!(md.contains("| qkv | 2 | 4 |"), "{md}");
        assert!(
            md.lines().last().unwrap().starts_with("| all | 3 | 6 |"),
            "{md}"
        );
    }

    #[test]
    fn the_timeline_draws_every_stamped_run_and_names_the_kinds() {
        let launches = vec![
            vec![run(0, 0, [1000, 1100, 1200, 2000], 0)],
            vec![
                run(1, 1, [2500, 2600, 2700, 3000], 0),
                run(0, 1, [0, 0, 0, 0], 0),
            ],
        ];
        let svg = timeline_svg(
            &launches,
            &|op| ["gate_up", "down<x>"][op].to_string(),
            "t & t",
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Three parts a run, two stamped runs: a path per (kind, part), each with one bar; plus
        // the background and two legend boxes.
        assert_eq!(svg.matches("<path").count(), 6);
        assert_eq!(svg.matches("z\"").count(), 6);
        assert_eq!(svg.matches("<rect").count(), 1 + 2);
        assert!(svg.contains("down&lt;x&gt;") && svg.contains("t &amp; t"));
        assert!(svg.contains("2 blocks") && svg.contains("2.0 us across"));
    }
}
