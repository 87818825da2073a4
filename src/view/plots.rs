//! The plots at the top of the rollouts list, over the rollouts that pass
//! its filter, drawn on the server as inline SVG (no script, nothing
//! fetched): the reward histogram, pass@1 and pass@k per task (the group),
//! calls per rollout, and the share resolved per policy version (a learning
//! curve: filter the list to an evaluation's tasks). Each is a `<figure>`
//! with an id (`plot-reward`, `plot-passk`, `plot-calls`, `plot-versions`);
//! each bar or point has a tooltip (`<title>`). A reward bar links to the
//! list filtered to its range, a task's bars (up to [`MAX_TASK_BARS`] tasks)
//! to its group page, a version's point to the list at that version.

use super::index::Summary;
use crate::grade::pass_at_k;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Reward histogram bars.
pub const REWARD_BINS: usize = 10;
/// At most this many bars of calls per rollout.
pub const CALL_BINS: usize = 20;
/// Up to this many tasks, each has its own pair of bars; with more, the
/// plot counts tasks by their pass@k instead.
pub const MAX_TASK_BARS: usize = 40;

/// A rollout counts as resolved when its reward is at least this.
pub const RESOLVED: f64 = 1.0;

/// A histogram bar: `count` values from `lo` to `hi` (rewards: `[lo, hi)`,
/// the last bar with `hi`; calls: both ends included).
#[derive(Debug, Clone, PartialEq)]
pub struct Bin {
    pub lo: f64,
    pub hi: f64,
    pub count: usize,
}

/// The rewards in [`REWARD_BINS`] equal bars from min(0, least) to
/// max(1, greatest); values that are not finite are left out.
pub fn reward_bins(rewards: &[f64]) -> Vec<Bin> {
    let finite: Vec<f64> = rewards.iter().copied().filter(|r| r.is_finite()).collect();
    if finite.is_empty() {
        return vec![];
    }
    let lo = finite.iter().copied().fold(0.0, f64::min);
    let hi = finite.iter().copied().fold(1.0, f64::max);
    let n = REWARD_BINS;
    let edge = |i: usize| lo + (hi - lo) * i as f64 / n as f64;
    let mut bins: Vec<Bin> = (0..n)
        .map(|i| Bin {
            lo: edge(i),
            hi: edge(i + 1),
            count: 0,
        })
        .collect();
    for r in finite {
        let i = (((r - lo) / (hi - lo)) * n as f64).floor() as usize;
        if let Some(b) = bins.get_mut(i.min(n - 1)) {
            b.count += 1;
        }
    }
    bins
}

/// Counts in at most [`CALL_BINS`] bars of equal whole width, from the
/// least count to the greatest.
pub fn count_bins(values: &[usize]) -> Vec<Bin> {
    let (Some(&lo), Some(&hi)) = (values.iter().min(), values.iter().max()) else {
        return vec![];
    };
    let width = (hi - lo + 1).div_ceil(CALL_BINS);
    let n = (hi - lo + 1).div_ceil(width);
    let mut bins: Vec<Bin> = (0..n)
        .map(|i| Bin {
            lo: (lo + i * width) as f64,
            hi: (lo + (i + 1) * width - 1) as f64,
            count: 0,
        })
        .collect();
    for v in values {
        if let Some(b) = bins.get_mut((v - lo) / width) {
            b.count += 1;
        }
    }
    bins
}

/// One task's samples.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskPass {
    pub task: String,
    /// Samples with a reward, and those resolved.
    pub graded: usize,
    pub resolved: usize,
    pub pass_at_1: f64,
    pub pass_at_k: f64,
}

/// pass@1 and pass@k of every task with a graded sample.
#[derive(Debug, Clone, PartialEq)]
pub struct PassAtK {
    /// The most common number of graded samples per task (the larger on a
    /// tie): the batch's k, when the rows are one batch.
    pub k: usize,
    /// By task name.
    pub tasks: Vec<TaskPass>,
}

impl PassAtK {
    /// Means over tasks: (pass@1, pass@k).
    pub fn means(&self) -> (f64, f64) {
        let n = self.tasks.len().max(1) as f64;
        (
            self.tasks.iter().map(|t| t.pass_at_1).sum::<f64>() / n,
            self.tasks.iter().map(|t| t.pass_at_k).sum::<f64>() / n,
        )
    }
}

/// pass@1 and pass@k per task (a rollout's group), a sample resolved when
/// its reward is at least [`RESOLVED`]; samples without a reward are not
/// graded.
pub fn pass_per_task(rows: &[&Summary]) -> PassAtK {
    let mut by_task: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for s in rows {
        if let Some(r) = s.reward {
            let e = by_task.entry(s.group.as_str()).or_default();
            e.0 += 1;
            e.1 += usize::from(r >= RESOLVED);
        }
    }
    let mut sizes: BTreeMap<usize, usize> = BTreeMap::new();
    for (n, _) in by_task.values() {
        *sizes.entry(*n).or_default() += 1;
    }
    let k = sizes
        .iter()
        .max_by_key(|(size, count)| (**count, **size))
        .map_or(1, |(size, _)| *size);
    let tasks = by_task
        .into_iter()
        .map(|(task, (n, c))| TaskPass {
            task: task.to_owned(),
            graded: n,
            resolved: c,
            pass_at_1: pass_at_k(n, c, 1),
            pass_at_k: pass_at_k(n, c, k),
        })
        .collect();
    PassAtK { k, tasks }
}

/// One policy version's graded rollouts.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionPoint {
    pub version: i64,
    pub graded: usize,
    pub resolved: usize,
    pub mean_reward: f64,
}

impl VersionPoint {
    pub fn share_resolved(&self) -> f64 {
        self.resolved as f64 / self.graded.max(1) as f64
    }
}

/// Per policy version (the newest a rollout's calls ran under, as the
/// list's `policy_version` column), its graded rollouts: how many, how
/// many resolved (reward at least [`RESOLVED`]) and the mean reward.
/// Rollouts without a reward or without a version are left out.
pub fn by_policy_version(rows: &[&Summary]) -> Vec<VersionPoint> {
    let mut by: BTreeMap<i64, (usize, usize, f64)> = BTreeMap::new();
    for s in rows {
        if let (Some(r), Some((_, v))) = (s.reward.filter(|r| r.is_finite()), s.policy_versions) {
            let e = by.entry(v).or_default();
            e.0 += 1;
            e.1 += usize::from(r >= RESOLVED);
            e.2 += r;
        }
    }
    by.into_iter()
        .map(|(version, (graded, resolved, sum))| VersionPoint {
            version,
            graded,
            resolved,
            mean_reward: sum / graded as f64,
        })
        .collect()
}

/// The share resolved per version as a line over evenly spaced versions,
/// 0 to 1 on the y axis; each point a link with a tooltip.
fn curve(points: &[VersionPoint], href: impl Fn(i64) -> String) -> String {
    let mut s = format!(
        r#"<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="resolved by policy version">"#
    );
    let plot_h = H - BOTTOM - 8.0;
    let base = H - BOTTOM;
    let _ = write!(
        s,
        r#"<line x1="{LEFT}" y1="{base}" x2="{W}" y2="{base}"/><text x="0" y="10">1</text>"#
    );
    let slot = (W - LEFT) / points.len().max(1) as f64;
    let at = |i: usize, p: &VersionPoint| {
        (
            LEFT + (i as f64 + 0.5) * slot,
            base - p.share_resolved().clamp(0.0, 1.0) * plot_h,
        )
    };
    let line: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (x, y) = at(i, p);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let _ = write!(
        s,
        r#"<polyline class="curve" fill="none" stroke="currentColor" points="{}"/>"#,
        line.join(" ")
    );
    for (i, p) in points.iter().enumerate() {
        let (x, y) = at(i, p);
        let title = format!(
            "policy version {}: {} of {} resolved ({:.0} %), mean reward {}",
            p.version,
            p.resolved,
            p.graded,
            100.0 * p.share_resolved(),
            num(p.mean_reward)
        );
        let _ = write!(
            s,
            r#"<a href="{}"><circle class="bar" cx="{x:.1}" cy="{y:.1}" r="3.5"><title>{}</title></circle></a>"#,
            esc(&href(p.version)),
            esc(&title)
        );
    }
    let ends = (
        points.first().map(|p| format!("v{}", p.version)),
        points.last().map(|p| format!("v{}", p.version)),
    );
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="{H}">{}</text><text x="{W}" y="{H}" text-anchor="end">{}</text></svg>"#,
        esc(&ends.0.unwrap_or_default()),
        esc(&ends.1.unwrap_or_default())
    );
    s
}

/// Text escaped for HTML and SVG, in an attribute or not.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// A path segment, percent-encoded.
fn segment(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            o.push(char::from(b));
        } else {
            let _ = write!(o, "%{b:02X}");
        }
    }
    o
}

/// A number as a short label.
fn num(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

struct Bar {
    /// 0 to 1: the share of the plot's height.
    height: f64,
    title: String,
    href: Option<String>,
    faint: bool,
}

const W: f64 = 300.0;
const H: f64 = 120.0;
const LEFT: f64 = 30.0;
const BOTTOM: f64 = 14.0;

/// A bar chart: `top` labels the greatest bar, `ends` the two ends of the
/// x axis.
fn chart(label: &str, bars: &[Bar], top: &str, ends: (&str, &str)) -> String {
    let mut s = format!(
        r#"<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{}">"#,
        esc(label)
    );
    let plot_h = H - BOTTOM - 4.0;
    let base = H - BOTTOM;
    let _ = write!(
        s,
        r#"<line x1="{LEFT}" y1="{base}" x2="{W}" y2="{base}"/><text x="0" y="10">{}</text>"#,
        esc(top)
    );
    let slot = (W - LEFT) / bars.len().max(1) as f64;
    for (i, b) in bars.iter().enumerate() {
        let h = (b.height.clamp(0.0, 1.0) * plot_h).max(if b.height > 0.0 { 1.0 } else { 0.0 });
        let rect = format!(
            r#"<rect class="bar" x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}"{}><title>{}</title></rect>"#,
            LEFT + i as f64 * slot + 0.5,
            base - h,
            (slot - 1.0).max(0.5),
            if b.faint {
                r#" fill-opacity="0.4""#
            } else {
                ""
            },
            esc(&b.title)
        );
        match &b.href {
            Some(href) => {
                let _ = write!(s, r#"<a href="{}">{rect}</a>"#, esc(href));
            }
            None => s.push_str(&rect),
        }
    }
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="{H}">{}</text><text x="{W}" y="{H}" text-anchor="end">{}</text></svg>"#,
        esc(&short(ends.0)),
        esc(&short(ends.1))
    );
    s
}

/// An axis label cut to fit under half a plot (a task id can be long);
/// each bar's tooltip has the whole name.
fn short(label: &str) -> String {
    const MAX: usize = 16;
    if label.chars().count() <= MAX {
        return label.to_owned();
    }
    let head: String = label.chars().take(MAX - 1).collect();
    format!("{head}…")
}

fn figure(id: &str, svg: &str, caption: &str) -> String {
    format!(
        r#"<figure id="{id}">{svg}<figcaption>{}</figcaption></figure>"#,
        esc(caption)
    )
}

fn histogram_bars(bins: &[Bin], title: impl Fn(&Bin) -> String) -> (Vec<Bar>, usize) {
    let most = bins.iter().map(|b| b.count).max().unwrap_or(0);
    let bars = bins
        .iter()
        .map(|b| Bar {
            height: b.count as f64 / most.max(1) as f64,
            title: title(b),
            href: None,
            faint: false,
        })
        .collect();
    (bars, most)
}

/// The plots over `rows`, as HTML; `reward_href(lo, hi)` is the list's
/// link filtered to rewards from `lo` to `hi`, `version_href(v)` to policy
/// version `v`.
pub fn render(
    rows: &[&Summary],
    reward_href: impl Fn(&str, &str) -> String,
    version_href: impl Fn(i64) -> String,
) -> String {
    let mut out = String::from(r#"<div class="plots">"#);

    let rewards: Vec<f64> = rows.iter().filter_map(|s| s.reward).collect();
    let bins = reward_bins(&rewards);
    let (mut bars, most) = histogram_bars(&bins, |b| {
        format!(
            "reward {} to {}: {} rollouts",
            num(b.lo),
            num(b.hi),
            b.count
        )
    });
    for (bar, b) in bars.iter_mut().zip(&bins) {
        bar.href = Some(reward_href(&num(b.lo), &num(b.hi)));
    }
    let ends = (
        bins.first().map(|b| num(b.lo)).unwrap_or_default(),
        bins.last().map(|b| num(b.hi)).unwrap_or_default(),
    );
    let unrewarded = rows.len() - rewards.len();
    let mut caption = format!("reward: {} rollouts", rewards.len());
    if unrewarded > 0 {
        let _ = write!(caption, " ({unrewarded} without a reward)");
    }
    let svg = chart(
        "reward histogram",
        &bars,
        &most.to_string(),
        (&ends.0, &ends.1),
    );
    out.push_str(&figure("plot-reward", &svg, &caption));

    let pass = pass_per_task(rows);
    let (p1, pk) = pass.means();
    let k = pass.k;
    let (svg, caption) = if pass.tasks.len() <= MAX_TASK_BARS {
        let mut bars = vec![];
        for t in &pass.tasks {
            let title = format!(
                "{}: pass@1 {:.2}, pass@{k} {:.2} ({} of {} resolved)",
                t.task, t.pass_at_1, t.pass_at_k, t.resolved, t.graded
            );
            let href = Some(format!("/groups/{}", segment(&t.task)));
            for (height, faint) in [(t.pass_at_1, true), (t.pass_at_k, false)] {
                bars.push(Bar {
                    height,
                    title: title.clone(),
                    href: href.clone(),
                    faint,
                });
            }
        }
        let ends = (
            pass.tasks.first().map(|t| t.task.as_str()).unwrap_or(""),
            pass.tasks.last().map(|t| t.task.as_str()).unwrap_or(""),
        );
        (
            chart("pass@k per task", &bars, "1", ends),
            format!(
                "pass@1 (light) and pass@{k} per task: means {p1:.2} and {pk:.2} over {} tasks",
                pass.tasks.len()
            ),
        )
    } else {
        let scores: Vec<f64> = pass.tasks.iter().map(|t| t.pass_at_k).collect();
        let bins = reward_bins(&scores);
        let (bars, most) = histogram_bars(&bins, |b| {
            format!("pass@{k} {} to {}: {} tasks", num(b.lo), num(b.hi), b.count)
        });
        (
            chart("tasks by pass@k", &bars, &most.to_string(), ("0", "1")),
            format!(
                "tasks by pass@{k}: means pass@1 {p1:.2}, pass@{k} {pk:.2} over {} tasks",
                pass.tasks.len()
            ),
        )
    };
    out.push_str(&figure("plot-passk", &svg, &caption));

    let calls: Vec<usize> = rows.iter().map(|s| s.calls).collect();
    let bins = count_bins(&calls);
    let (bars, most) = histogram_bars(&bins, |b| {
        let range = if b.lo == b.hi {
            num(b.lo)
        } else {
            format!("{} to {}", num(b.lo), num(b.hi))
        };
        format!("{range} calls: {} rollouts", b.count)
    });
    let ends = (
        bins.first().map(|b| num(b.lo)).unwrap_or_default(),
        bins.last().map(|b| num(b.hi)).unwrap_or_default(),
    );
    let svg = chart(
        "calls per rollout",
        &bars,
        &most.to_string(),
        (&ends.0, &ends.1),
    );
    let caption = format!("calls per rollout: {} rollouts", rows.len());
    out.push_str(&figure("plot-calls", &svg, &caption));

    let points = by_policy_version(rows);
    if !points.is_empty() {
        let graded: usize = points.iter().map(|p| p.graded).sum();
        let caption = format!(
            "resolved by policy version: {} versions, {graded} graded rollouts ({})",
            points.len(),
            points
                .iter()
                .map(|p| format!("v{} {}/{}", p.version, p.resolved, p.graded))
                .collect::<Vec<_>>()
                .join(", ")
        );
        out.push_str(&figure(
            "plot-versions",
            &curve(&points, version_href),
            &caption,
        ));
    }

    out.push_str("</div>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: &str, group: &str, reward: Option<f64>, calls: usize) -> Summary {
        Summary {
            rollout_id: id.into(),
            group: group.into(),
            reward,
            calls,
            ..Summary::default()
        }
    }

    #[test]
    fn pass_per_task_counts_graded_and_resolved_samples() {
        let rows = [
            // Four samples, one resolved.
            s("a0", "a", Some(1.0), 3),
            s("a1", "a", Some(0.0), 3),
            s("a2", "a", Some(0.5), 3),
            s("a3", "a", Some(0.0), 3),
            // Four samples, none resolved; an ungraded one left out.
            s("b0", "b", Some(0.0), 1),
            s("b1", "b", Some(0.0), 1),
            s("b2", "b", Some(0.0), 1),
            s("b3", "b", Some(0.0), 1),
            s("b4", "b", None, 1),
            // Five samples, two resolved.
            s("c0", "c", Some(1.0), 1),
            s("c1", "c", Some(1.0), 1),
            s("c2", "c", Some(0.0), 1),
            s("c3", "c", Some(0.0), 1),
            s("c4", "c", Some(0.0), 1),
            // Never graded: not a task here.
            s("d0", "d", None, 1),
        ];
        let refs: Vec<&Summary> = rows.iter().collect();
        let p = pass_per_task(&refs);
        assert_eq!(p.k, 4); // two tasks of 4, one of 5
        let got: Vec<(&str, usize, usize)> = p
            .tasks
            .iter()
            .map(|t| (t.task.as_str(), t.graded, t.resolved))
            .collect();
        assert_eq!(got, [("a", 4, 1), ("b", 4, 0), ("c", 5, 2)]);
        assert!((p.tasks[0].pass_at_1 - 0.25).abs() < 1e-12);
        assert_eq!(p.tasks[0].pass_at_k, 1.0);
        assert_eq!(p.tasks[1].pass_at_k, 0.0);
        // 1 - C(3,4)/C(5,4) = 1 - 0/5
        assert_eq!(p.tasks[2].pass_at_k, 1.0);
        assert!((p.tasks[2].pass_at_1 - 0.4).abs() < 1e-12);
        let (p1, pk) = p.means();
        assert!((p1 - (0.25 + 0.0 + 0.4) / 3.0).abs() < 1e-12);
        assert!((pk - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn histograms_bin_rewards_and_counts() {
        let b = reward_bins(&[0.0, 0.05, 0.1, 0.55, 1.0, 1.0, f64::NAN]);
        assert_eq!(b.len(), REWARD_BINS);
        let counts: Vec<usize> = b.iter().map(|b| b.count).collect();
        assert_eq!(counts, [2, 1, 0, 0, 0, 1, 0, 0, 0, 2]);
        assert_eq!((b[0].lo, b[9].hi), (0.0, 1.0));
        // Rewards outside [0, 1] widen the range.
        let b = reward_bins(&[-1.0, 3.0]);
        assert_eq!((b[0].lo, b[9].hi), (-1.0, 3.0));
        assert_eq!((b[0].count, b[9].count), (1, 1));
        assert!(reward_bins(&[]).is_empty());

        let b = count_bins(&[1, 1, 2, 5]);
        let got: Vec<(f64, f64, usize)> = b.iter().map(|b| (b.lo, b.hi, b.count)).collect();
        assert_eq!(
            got,
            [
                (1., 1., 2),
                (2., 2., 1),
                (3., 3., 0),
                (4., 4., 0),
                (5., 5., 1)
            ]
        );
        // 0 ..= 99 in 20 bars of 5.
        let wide: Vec<usize> = (0..100).collect();
        let b = count_bins(&wide);
        assert_eq!(b.len(), CALL_BINS);
        assert!(b.iter().all(|b| b.count == 5 && b.hi - b.lo == 4.0));
        assert!(count_bins(&[]).is_empty());
    }

    #[test]
    fn the_plots_are_svg_figures_with_escaped_text() {
        let rows = [
            s("r0", "<task & co>", Some(1.0), 2),
            s("r1", "<task & co>", Some(0.0), 4),
        ];
        let refs: Vec<&Summary> = rows.iter().collect();
        let html = render(
            &refs,
            |lo, hi| format!("/?min_reward={lo}&max_reward={hi}"),
            |v| format!("/?f.policy_version={v}"),
        );
        for id in ["plot-reward", "plot-passk", "plot-calls"] {
            assert!(html.contains(&format!(r#"<figure id="{id}"><svg"#)), "{id}");
        }
        assert!(!html.contains("<task"));
        assert!(html.contains("&lt;task &amp; co&gt;: pass@1 0.50, pass@2 1.00"));
        assert!(html.contains(r#"href="/groups/%3Ctask%20%26%20co%3E""#));
        assert!(html.contains(r#"href="/?min_reward=0.9&amp;max_reward=1""#));
        assert_eq!(html.matches(r#"class="bar""#).count(), 10 + 2 + 3);
        // No policy versions: no curve.
        assert!(!html.contains("plot-versions"));
        // No rollouts: the figures are still there, empty.
        let empty = render(&[], |_, _| String::new(), |_| String::new());
        assert!(empty.contains(r#"id="plot-calls""#) && !empty.contains("<rect"));
    }

    #[test]
    fn the_curve_is_the_share_resolved_per_policy_version() {
        let at = |id: &str, reward: Option<f64>, versions: Option<(i64, i64)>| Summary {
            policy_versions: versions,
            ..s(id, id, reward, 1)
        };
        let rows = [
            at("a", Some(0.0), Some((0, 0))),
            at("b", Some(0.0), Some((0, 0))),
            at("c", Some(1.0), Some((1, 1))),
            at("d", Some(0.5), Some((1, 1))),
            // Counted at the newest version it ran under.
            at("e", Some(1.0), Some((1, 3))),
            // Not graded, or no version: left out.
            at("f", None, Some((3, 3))),
            at("g", Some(1.0), None),
        ];
        let refs: Vec<&Summary> = rows.iter().collect();
        let got: Vec<(i64, usize, usize)> = by_policy_version(&refs)
            .iter()
            .map(|p| (p.version, p.graded, p.resolved))
            .collect();
        assert_eq!(got, [(0, 2, 0), (1, 2, 1), (3, 1, 1)]);
        assert_eq!(by_policy_version(&refs)[1].mean_reward, 0.75);
        let html = render(
            &refs,
            |_, _| String::new(),
            |v| format!("/?f.policy_version={v}"),
        );
        assert!(html.contains(r#"<figure id="plot-versions"><svg"#));
        assert!(html.contains("policy version 1: 1 of 2 resolved (50 %), mean reward 0.75"));
        assert!(html.contains(r#"href="/?f.policy_version=3""#));
        assert!(html.contains("v0 0/2, v1 1/2, v3 1/1"));
        assert_eq!(html.matches("<circle").count(), 3);
    }
}
