//! The report's PNGs: throughput against concurrency (one line per system and
//! policy) and latency CDFs (one panel per concurrency).

use std::path::Path;
use std::sync::Once;

use anyhow::Context;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::{Matrix, SeriesKey};

const SIZE: (u32, u32) = (960, 560);

type Drawn = Result<(), Box<dyn std::error::Error>>;

/// plotters' `ab_glyph` text needs a registered face: the embedded DejaVu keeps
/// charts independent of the machine's fonts.
fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
    });
}

fn label((system, policy): &SeriesKey) -> String {
    if policy == super::markdown::NO_POLICY {
        system.clone()
    } else {
        format!("{system}, {policy}")
    }
}

pub fn write_throughput(matrix: &Matrix, path: &Path) -> anyhow::Result<()> {
    fonts();
    draw_throughput(matrix, path)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("drawing {}", path.display()))
}

pub fn write_latency_cdfs(matrix: &Matrix, path: &Path) -> anyhow::Result<()> {
    fonts();
    draw_cdfs(matrix, path).map_err(|e| anyhow::anyhow!("{e}")).with_context(|| format!("drawing {}", path.display()))
}

/// Concurrencies sit at evenly spaced positions (1, 4, 16 are a geometric series).
fn draw_throughput(matrix: &Matrix, path: &Path) -> Drawn {
    let levels = matrix.concurrencies();
    let series = matrix.series();
    let y_max = matrix.runs.iter().map(|r| r.report.summary.throughput_tok_s).fold(1.0, f64::max) * 1.15;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Throughput vs concurrency (output tokens/s)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5f64..(levels.len() as f64 - 0.5), 0f64..y_max)?;
    let tick = |x: &f64| levels.get(x.round() as usize).filter(|_| (x - x.round()).abs() < 1e-6).map(|c| c.to_string());
    chart
        .configure_mesh()
        .x_labels(levels.len() * 2 + 1)
        .x_label_formatter(&|x| tick(x).unwrap_or_default())
        .x_desc("concurrent clients N")
        .y_desc("tokens/s")
        .label_style(("sans-serif", 15))
        .light_line_style(RGBColor(240, 240, 240))
        .draw()?;
    for (i, key) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = levels
            .iter()
            .enumerate()
            .filter_map(|(x, &c)| matrix.cell(&key.0, &key.1, c).map(|cell| (x as f64, cell.throughput())))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label(key))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&xy| Circle::new(xy, 4, color.filled())))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present()?;
    Ok(())
}

/// One panel per concurrency: the fraction of requests done within a latency.
fn draw_cdfs(matrix: &Matrix, path: &Path) -> Drawn {
    let levels = matrix.concurrencies();
    let series = matrix.series();
    let root = BitMapBackend::new(path, (SIZE.0, 340 * levels.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    for (panel, &c) in root.split_evenly((levels.len(), 1)).iter().zip(&levels) {
        let curves: Vec<(usize, Vec<f64>)> = series
            .iter()
            .enumerate()
            .filter_map(|(i, key)| matrix.cell(&key.0, &key.1, c).map(|cell| (i, cell.latencies())))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        let x_max = curves.iter().filter_map(|(_, v)| v.last().copied()).fold(0.1, f64::max) * 1.05;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("Latency CDF, N = {c}"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max, 0f64..1.0)?;
        chart
            .configure_mesh()
            .x_desc("end-to-end latency (s)")
            .y_desc("fraction of requests")
            .label_style(("sans-serif", 14))
            .light_line_style(RGBColor(240, 240, 240))
            .draw()?;
        for (i, latencies) in curves {
            let color = Palette99::pick(i).to_rgba();
            let n = latencies.len() as f64;
            let steps: Vec<(f64, f64)> =
                latencies.iter().enumerate().flat_map(|(k, &x)| [(x, k as f64 / n), (x, (k + 1) as f64 / n)]).collect();
            chart
                .draw_series(LineSeries::new(steps, color.stroke_width(2)))?
                .label(label(&series[i]))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    }
    root.present()?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, position: SeriesLabelPosition) -> Drawn {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::tests::folder;

    #[test]
    fn both_charts_are_pngs() {
        let dir = folder(&[
            ("engine", "random p=0.1", 1, 10.0),
            ("standard", "random p=0.1", 1, 4.0),
            ("engine", "random p=0.1", 4, 30.0),
            ("llm-only", "-", 4, 20.0),
        ]);
        let m = Matrix::load(dir.path()).unwrap();
        for (name, write) in
            [("t.png", write_throughput as fn(&Matrix, &Path) -> anyhow::Result<()>), ("l.png", write_latency_cdfs)]
        {
            let path = dir.path().join(name);
            write(&m, &path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000, "{name}");
        }
    }
}
