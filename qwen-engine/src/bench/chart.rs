//! The bundle's chart: per (input, concurrency) group, a bar per cell of ours (one per policy),
//! the cell's bandwidth limit as a red mark across its bar with our share above it, and a bar per
//! transformers implementation; decode tok/s on a log axis (eager transformers and the limit at
//! concurrency 8 are two and a half decades apart).
//!
//! plotters' SVG backend writes `<text>` elements and lets the viewer pick the font, so no font
//! library or fontconfig is needed (the crate is built without its `ttf` feature).

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::{BenchReport, Cell, ReportError, PEER_IMPLEMENTATIONS};
use aot_kernels::dispatch::Policy;

/// Series colours (SVG `fill`), also what the tests count bars by.
pub const OURS_AUTO: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
pub const OURS_SASS_ONLY: RGBColor = RGBColor(0x31, 0x82, 0xbd);
pub const OURS_PTX_ONLY: RGBColor = RGBColor(0x9e, 0xca, 0xe1);
pub const PEER_EAGER: RGBColor = RGBColor(0xbd, 0xbd, 0xbd);
pub const PEER_STATIC: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
pub const LIMIT: RGBColor = RGBColor(0xd6, 0x27, 0x28);

const FONT: &str = "sans-serif";
const HEIGHT: u32 = 540;

pub fn policy_color(p: Policy) -> RGBColor {
    match p {
        Policy::Auto => OURS_AUTO,
        Policy::SassOnly => OURS_SASS_ONLY,
        Policy::PtxOnly => OURS_PTX_ONLY,
    }
}

fn peer_color(implementation: &str) -> RGBColor {
    if implementation == "eager" {
        PEER_EAGER
    } else {
        PEER_STATIC
    }
}

type ChartError = ReportError;

fn chart_err(e: impl std::fmt::Display) -> ChartError {
    ReportError::Chart(e.to_string())
}

/// What the chart draws: groups, and per group the bar slots in order.
struct Layout<'a> {
    groups: Vec<(usize, usize)>,
    policies: Vec<Policy>,
    peers: Vec<&'static str>,
    report: &'a BenchReport,
}

impl<'a> Layout<'a> {
    fn new(report: &'a BenchReport) -> Self {
        let mut groups: Vec<(usize, usize)> = report
            .cells
            .iter()
            .map(|c| (c.input, c.concurrency))
            .collect();
        groups.sort_by_key(|&(i, c)| (c, i));
        groups.dedup();
        let mut policies: Vec<Policy> = Policy::ALL
            .into_iter()
            .filter(|p| report.cells.iter().any(|c| c.policy == *p))
            .collect();
        policies.dedup();
        let peers = PEER_IMPLEMENTATIONS
            .into_iter()
            .filter(|name| {
                report.peers.as_ref().is_some_and(|p| {
                    p.cells.iter().any(|c| {
                        c.implementation == *name && groups.contains(&(c.input, c.concurrency))
                    })
                })
            })
            .collect();
        Layout {
            groups,
            policies,
            peers,
            report,
        }
    }

    fn slots(&self) -> usize {
        self.policies.len() + self.peers.len()
    }

    /// The x range of slot `slot` in group `group` (a group spans [g, g + 1]).
    fn slot_x(&self, group: usize, slot: usize) -> (f64, f64) {
        let pad = 0.12;
        let width = (1.0 - 2.0 * pad) / self.slots() as f64;
        let x0 = group as f64 + pad + slot as f64 * width;
        (x0 + 0.06 * width, x0 + 0.94 * width)
    }

    fn cell(&self, group: usize, policy: Policy) -> Option<&'a Cell> {
        let (input, concurrency) = self.groups[group];
        self.report
            .cells
            .iter()
            .find(|c| (c.input, c.concurrency, c.policy) == (input, concurrency, policy))
    }

    fn peer(&self, group: usize, implementation: &str) -> Option<f64> {
        let (input, concurrency) = self.groups[group];
        self.report.peers.as_ref()?.cells.iter().find_map(|c| {
            ((c.input, c.concurrency) == (input, concurrency) && c.implementation == implementation)
                .then_some(c.decode_tok_s)
        })
    }

    /// Every value on the y axis, for its range.
    fn values(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .report
            .cells
            .iter()
            .flat_map(|c| [c.decode_tok_s, c.limit_tok_s])
            .collect();
        if let Some(p) = &self.report.peers {
            v.extend(p.cells.iter().map(|c| c.decode_tok_s));
        }
        v.retain(|x| x.is_finite() && *x > 0.0);
        v
    }
}

impl BenchReport {
    /// The matrix as an SVG chart (see the module docs). Fails on a bundle without a positive
    /// finite value to draw.
    pub fn chart_svg(&self) -> Result<String, ReportError> {
        let layout = Layout::new(self);
        let values = layout.values();
        if layout.groups.is_empty() || values.is_empty() {
            return Err(ReportError::Chart(
                "no cell with a positive tok/s to draw".into(),
            ));
        }
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = values.iter().copied().fold(0.0, f64::max);
        let y_lo = 10f64.powf((lo * 0.8).log10().floor());
        let y_hi = 10f64.powf((hi * 1.5).log10().ceil());
        let width = (170 + layout.groups.len() as u32 * (40 + 30 * layout.slots() as u32)).max(720);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (width, HEIGHT)).into_drawing_area();
            root.fill(&WHITE).map_err(chart_err)?;
            draw(&root, &layout, (y_lo, y_hi))?;
            root.present().map_err(chart_err)?;
        }
        Ok(svg)
    }
}

fn draw(
    root: &DrawingArea<SVGBackend, Shift>,
    layout: &Layout,
    (y_lo, y_hi): (f64, f64),
) -> Result<(), ChartError> {
    let r = layout.report;
    let title = format!(
        "{}{} decode on {}: tok/s per cell against the {:.0} GB/s read limit and transformers",
        if r.sample {
            "SAMPLE (a test fixture, not a run to cite): "
        } else {
            ""
        },
        r.model.name,
        r.device.name,
        r.bandwidth.read_gbs
    );
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 20))
        .margin(14)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..layout.groups.len() as f64, (y_lo..y_hi).log_scale())
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("decode tok/s (log scale)")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 15))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(chart_err)?;

    let groups = 0..layout.groups.len();
    // Ours: one bar per cell, a series per policy.
    for (slot, &policy) in layout.policies.iter().enumerate() {
        let color = policy_color(policy);
        let bars = groups.clone().filter_map(|g| {
            let c = layout.cell(g, policy)?;
            let (x0, x1) = layout.slot_x(g, slot);
            Some(Rectangle::new(
                [(x0, y_lo), (x1, c.decode_tok_s)],
                color.filled(),
            ))
        });
        chart
            .draw_series(bars)
            .map_err(chart_err)?
            .label(format!("ours ({policy})"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    // The limit of each cell across its bar, and our share of it above.
    let limits = layout
        .policies
        .iter()
        .enumerate()
        .flat_map(|(slot, &policy)| {
            groups.clone().filter_map(move |g| {
                let c = layout.cell(g, policy)?;
                let (x0, x1) = layout.slot_x(g, slot);
                let pad = (x1 - x0) * 0.25;
                Some(PathElement::new(
                    vec![(x0 - pad, c.limit_tok_s), (x1 + pad, c.limit_tok_s)],
                    LIMIT.stroke_width(3),
                ))
            })
        });
    chart
        .draw_series(limits)
        .map_err(chart_err)?
        .label("bandwidth limit (read GB/s / bytes per step)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], LIMIT.stroke_width(3)));
    let share_style = TextStyle::from((FONT, 13).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    let shares = layout
        .policies
        .iter()
        .enumerate()
        .flat_map(|(slot, &policy)| {
            let style = share_style.clone();
            groups.clone().filter_map(move |g| {
                let c = layout.cell(g, policy)?;
                let (x0, x1) = layout.slot_x(g, slot);
                let y = c.limit_tok_s.max(c.decode_tok_s) * 1.04;
                Some(Text::new(
                    format!("{:.0}%", 100.0 * c.limit_share),
                    ((x0 + x1) / 2.0, y),
                    style.clone(),
                ))
            })
        });
    chart.draw_series(shares).map_err(chart_err)?;
    // The peers: a series per implementation.
    for (i, &name) in layout.peers.iter().enumerate() {
        let slot = layout.policies.len() + i;
        let color = peer_color(name);
        let bars = groups.clone().filter_map(|g| {
            let t = layout.peer(g, name)?;
            let (x0, x1) = layout.slot_x(g, slot);
            Some(Rectangle::new([(x0, y_lo), (x1, t)], color.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(chart_err)?
            .label(format!("transformers {name}"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(chart_err)?;

    // Group labels under the axis: the cell, and our ratio to the faster peer.
    let label_style = TextStyle::from((FONT, 17).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    let grey = BLACK.mix(0.7);
    let ratio_style = TextStyle::from((FONT, 14).into_font())
        .color(&grey)
        .pos(Pos::new(HPos::Center, VPos::Top));
    for g in groups {
        let (input, concurrency) = layout.groups[g];
        let (px, py) = chart.backend_coord(&(g as f64 + 0.5, y_lo));
        root.draw(&Text::new(
            format!("i{input} c{concurrency}"),
            (px, py + 8),
            label_style.clone(),
        ))
        .map_err(chart_err)?;
        let ratio = layout
            .policies
            .iter()
            .find_map(|&p| layout.cell(g, p)?.peer_ratio.map(|r| (p, r)));
        if let Some((policy, ratio)) = ratio {
            root.draw(&Text::new(
                format!("{policy}: {ratio:.2}x peer"),
                (px, py + 30),
                ratio_style.clone(),
            ))
            .map_err(chart_err)?;
        }
    }
    Ok(())
}
