//! Sweep results on disk: a CSV with every measured field, and a PNG of measured
//! against predicted throughput per threshold vector, one colour per N.

use std::io::Write;
use std::path::Path;
use std::sync::Once;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::SweepPoint;

/// "2,1": how a threshold vector is written in the CSV and on the chart's axis.
pub fn label(thresholds: &[usize]) -> String {
    thresholds.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",")
}

/// One row per point; per-model columns are prefixed by the model's name, in engine order.
pub fn write_csv(points: &[SweepPoint], out: &mut dyn Write) -> std::io::Result<()> {
    let names: Vec<&str> = points.first().map_or(Vec::new(), |p| p.models.iter().map(|m| m.model.as_str()).collect());
    let mut header: Vec<String> =
        ["concurrency", "thresholds", "tokens", "seconds", "tokens_per_sec", "predicted_tokens_per_sec"]
            .map(String::from)
            .to_vec();
    for name in &names {
        header.extend(MODEL_COLUMNS.iter().map(|c| format!("{name}_{c}")));
    }
    writeln!(out, "{}", header.iter().map(|h| field(h)).collect::<Vec<_>>().join(","))?;
    for p in points {
        writeln!(out, "{}", row(p).join(","))?;
    }
    Ok(())
}

const MODEL_COLUMNS: [&str; 8] = [
    "threshold",
    "steps",
    "rows_per_step",
    "ms_per_step",
    "tokens_fed_per_step",
    "tokens_committed",
    "handoffs_per_row",
    "busy_fraction",
];

fn row(p: &SweepPoint) -> Vec<String> {
    let mut cells = vec![
        p.concurrency.to_string(),
        field(&label(&p.thresholds)),
        p.tokens.to_string(),
        format!("{:.4}", p.seconds),
        format!("{:.3}", p.tokens_per_sec),
        p.predicted_tokens_per_sec.map_or(String::new(), |t| format!("{t:.3}")),
    ];
    for (m, b) in p.models.iter().zip(&p.thresholds) {
        cells.extend([
            b.to_string(),
            m.steps.to_string(),
            format!("{:.4}", m.rows_per_step),
            format!("{:.4}", m.ms_per_step),
            format!("{:.4}", m.tokens_fed_per_step),
            m.tokens_committed.to_string(),
            format!("{:.5}", m.handoffs_per_row),
            format!("{:.4}", m.busy_fraction),
        ]);
    }
    cells
}

/// RFC 4180 quoting, only where a cell needs it.
fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// The distinct threshold vectors of the points, in the sweep's order (lexicographic).
fn x_order(points: &[SweepPoint]) -> Vec<Vec<usize>> {
    let mut order: Vec<Vec<usize>> = points.iter().map(|p| p.thresholds.clone()).collect();
    order.sort();
    order.dedup();
    order
}

/// The concurrencies of the points, in the order they were run.
fn concurrencies(points: &[SweepPoint]) -> Vec<usize> {
    let mut seen = Vec::new();
    for p in points {
        if !seen.contains(&p.concurrency) {
            seen.push(p.concurrency);
        }
    }
    seen
}

/// With the `ab_glyph` backend plotters has no fonts until one is registered; the
/// embedded DejaVu face keeps charts independent of the machine's fonts.
fn register_fonts() {
    static FONTS: Once = Once::new();
    FONTS.call_once(|| {
        for family in ["sans-serif", "serif", "monospace"] {
            // The bundled face always parses; a failure would show as missing text.
            let _ = plotters::style::register_font(family, FontStyle::Normal, dejavu::sans::regular());
        }
    });
}

const SIZE: (u32, u32) = (1100, 650);

/// Measured throughput (solid, with markers) and predicted (dashed, where the
/// prediction exists) against the threshold vector, one colour per N.
pub fn write_chart(points: &[SweepPoint], path: &Path) -> anyhow::Result<()> {
    register_fonts();
    draw(points, path).map_err(|e| anyhow::anyhow!("{e}")).with_context(|| format!("drawing {}", path.display()))
}

fn draw(points: &[SweepPoint], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let order = x_order(points);
    let labels: Vec<String> = order.iter().map(|b| label(b)).collect();
    let y_max =
        points.iter().flat_map(|p| [Some(p.tokens_per_sec), p.predicted_tokens_per_sec]).flatten().fold(1.0, f64::max)
            * 1.15;
    let names: Vec<&str> = points.first().map_or(Vec::new(), |p| p.models.iter().map(|m| m.model.as_str()).collect());

    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    // One unit of margin on either side keeps the first and last points off the frame.
    let mut chart = ChartBuilder::on(&root)
        .caption("tokens/s: measured (solid) vs predicted (dashed)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(72)
        .build_cartesian_2d(-1i32..order.len() as i32, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_labels(order.len() + 2)
        .x_label_formatter(&|x| usize::try_from(*x).ok().and_then(|i| labels.get(i).cloned()).unwrap_or_default())
        .x_desc(format!("thresholds ({})", names.join(",")))
        .y_desc("tokens/s")
        .label_style(("sans-serif", 15))
        .light_line_style(RGBColor(240, 240, 240))
        .draw()?;

    let x_of = |p: &SweepPoint| order.iter().position(|b| *b == p.thresholds).unwrap_or(0) as i32;
    for (i, n) in concurrencies(points).into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mine: Vec<&SweepPoint> = points.iter().filter(|p| p.concurrency == n).collect();
        let measured: Vec<(i32, f64)> = mine.iter().map(|p| (x_of(p), p.tokens_per_sec)).collect();
        chart
            .draw_series(LineSeries::new(measured.clone(), color.stroke_width(2)))?
            .label(format!("N={n} measured"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
        chart.draw_series(measured.iter().map(|&xy| Circle::new(xy, 4, color.filled())))?;
        let predicted: Vec<(i32, f64)> =
            mine.iter().filter_map(|p| p.predicted_tokens_per_sec.map(|t| (x_of(p), t))).collect();
        if !predicted.is_empty() {
            chart
                .draw_series(DashedLineSeries::new(predicted, 8, 5, color.stroke_width(2)))?
                .label(format!("N={n} predicted"))
                .legend(move |(x, y)| {
                    let style = color.stroke_width(2);
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (9, 0)], style)
                        + PathElement::new(vec![(15, 0), (24, 0)], style)
                });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::ModelWindow;

    fn point(n: usize, thresholds: &[usize], tps: f64, predicted: Option<f64>) -> SweepPoint {
        let window = |name: &str| ModelWindow {
            model: name.into(),
            steps: 100,
            rows_per_step: 1.5,
            ms_per_step: 2.0,
            tokens_fed_per_step: 1.5,
            tokens_committed: 140,
            handoffs_per_row: 0.1,
            busy_fraction: 0.5,
            stats: Default::default(),
        };
        SweepPoint {
            concurrency: n,
            thresholds: thresholds.to_vec(),
            tokens: (tps * 2.0) as u64,
            seconds: 2.0,
            tokens_per_sec: tps,
            predicted_tokens_per_sec: predicted,
            models: vec![window("small"), window("big")],
        }
    }

    #[test]
    fn csv_has_one_row_per_point_and_quotes_threshold_labels() {
        let points = [point(2, &[1, 1], 100.0, None), point(4, &[2, 1], 180.5, Some(190.0))];
        let mut out = Vec::new();
        write_csv(&points, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("concurrency,thresholds,tokens,seconds,tokens_per_sec,predicted_tokens_per_sec,"));
        assert!(lines[0].contains("small_threshold,small_steps") && lines[0].ends_with("big_busy_fraction"));
        assert_eq!(lines[0].split(',').count(), 6 + 2 * MODEL_COLUMNS.len());
        assert!(lines[1].starts_with("2,\"1,1\",200,2.0000,100.000,,1,100,"), "{}", lines[1]);
        assert!(lines[2].starts_with("4,\"2,1\",361,2.0000,180.500,190.000,2,"), "{}", lines[2]);
    }

    #[test]
    fn cells_are_quoted_only_when_needed() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn chart_is_a_png_with_and_without_predictions() {
        let dir = tempfile::TempDir::new().unwrap();
        let points = [
            point(2, &[1, 1], 100.0, Some(110.0)),
            point(2, &[2, 1], 120.0, Some(118.0)),
            point(3, &[1, 1], 130.0, None),
            point(3, &[2, 2], 150.0, None),
        ];
        let path = dir.path().join("sweep.png");
        write_chart(&points, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000);
    }
}
