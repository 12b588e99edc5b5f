//! Rotary position embeddings, computed per token from its own position so that rows
//! of a varlen batch at different offsets need no shared table.

use super::config::{Llama3RopeScaling, ModelConfig};

#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f64>,
}

impl Rope {
    pub fn new(config: &ModelConfig) -> Self {
        let dim = config.head_dim;
        let mut inv_freq: Vec<f64> =
            (0..dim / 2).map(|i| 1.0 / config.rope_theta.powf((2 * i) as f64 / dim as f64)).collect();
        if let Some(scaling) = &config.rope_scaling {
            apply_llama3_scaling(&mut inv_freq, scaling);
        }
        Rope { inv_freq }
    }

    /// cos and sin of every frequency at `position`, each `head_dim / 2` long.
    pub fn cos_sin(&self, position: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (i, f) in self.inv_freq.iter().enumerate() {
            // HF computes the angle in f32; rounding it the same way keeps golden
            // logits within tolerance at large positions.
            let angle = (position as f32 * *f as f32) as f64;
            cos[i] = angle.cos() as f32;
            sin[i] = angle.sin() as f32;
        }
    }

    /// The frequencies as f32, as a device computes each angle: `position as f32 * f`.
    pub fn inv_freq_f32(&self) -> Vec<f32> {
        self.inv_freq.iter().map(|&f| f as f32).collect()
    }

    pub fn half_dim(&self) -> usize {
        self.inv_freq.len()
    }
}

/// Rotates one head vector in place ("rotate half" layout, as HF Llama/Qwen).
#[inline]
pub fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    let (a, b) = x.split_at_mut(half);
    for i in 0..half {
        let (x1, x2) = (a[i], b[i]);
        a[i] = x1 * cos[i] - x2 * sin[i];
        b[i] = x2 * cos[i] + x1 * sin[i];
    }
}

fn apply_llama3_scaling(inv_freq: &mut [f64], s: &Llama3RopeScaling) {
    let old_len = s.original_max_position_embeddings as f64;
    let low_freq_wavelen = old_len / s.low_freq_factor;
    let high_freq_wavelen = old_len / s.high_freq_factor;
    for f in inv_freq.iter_mut() {
        let wavelen = 2.0 * std::f64::consts::PI / *f;
        if wavelen > low_freq_wavelen {
            *f /= s.factor;
        } else if wavelen >= high_freq_wavelen {
            let smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
            *f = (1.0 - smooth) * *f / s.factor + smooth * *f;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_is_identity_at_zero() {
        let config = crate::model::presets::preset("tiny").unwrap();
        let rope = Rope::new(&config);
        let h = rope.half_dim();
        let (mut cos, mut sin) = (vec![0.0; h], vec![0.0; h]);
        let x: Vec<f32> = (0..2 * h).map(|i| (i as f32 * 0.37).sin()).collect();
        rope.cos_sin(0, &mut cos, &mut sin);
        let mut y = x.clone();
        rotate(&mut y, &cos, &sin);
        assert_eq!(x, y);
        rope.cos_sin(1234, &mut cos, &mut sin);
        rotate(&mut y, &cos, &sin);
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((norm(&x) - norm(&y)).abs() < 1e-4);
        assert_ne!(x, y);
    }
}
