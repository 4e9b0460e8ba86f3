//! The recurrent state of the linear layers, per state slot, in fp32: for each linear layer the
//! convolution's last `kernel - 1` inputs (`[channels][kernel - 1]`, oldest first) and the delta
//! rule's state of every value head (`[value heads][dk][dv]`). A slot is zeroed when a request's
//! first step runs in it, so it never sees the state of the request before.

use crate::model::Qwen35MoeConfig;

#[derive(Debug)]
pub struct RecurrentStates {
    conv_len: usize,
    delta_len: usize,
    layers: usize,
    /// Per slot: `layers` x (conv, delta), back to back.
    slots: Vec<Vec<f32>>,
}

impl RecurrentStates {
    pub fn new(c: &Qwen35MoeConfig, slots: usize) -> Self {
        let conv_len = c.conv_dim() * (c.linear_conv_kernel_dim - 1);
        let delta_len = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
        let layers = c.linear_layers();
        RecurrentStates {
            conv_len,
            delta_len,
            layers,
            slots: (0..slots)
                .map(|_| vec![0.0; layers * (conv_len + delta_len)])
                .collect(),
        }
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    pub fn bytes(&self) -> usize {
        self.slots.iter().map(|s| s.len() * 4).sum()
    }

    /// Starts `slot` from zero state (a new request).
    pub fn reset(&mut self, slot: usize) {
        self.slots[slot].fill(0.0);
    }

    /// The (conv, delta) state of linear layer `linear_index` in `slot`.
    pub fn layer_mut(&mut self, slot: usize, linear_index: usize) -> (&mut [f32], &mut [f32]) {
        debug_assert!(linear_index < self.layers);
        let per = self.conv_len + self.delta_len;
        let layer = &mut self.slots[slot][linear_index * per..(linear_index + 1) * per];
        layer.split_at_mut(self.conv_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_separate_and_reset_to_zero() {
        let c = Qwen35MoeConfig::tiny();
        let mut s = RecurrentStates::new(&c, 2);
        assert_eq!(s.bytes(), 2 * c.state_bytes());
        s.layer_mut(0, 2).1[5] = 1.0;
        s.layer_mut(1, 2).0[0] = 2.0;
        assert_eq!(s.layer_mut(0, 2).1[5], 1.0);
        assert_eq!(
            s.layer_mut(0, 2).0[0],
            0.0,
            "slot 1's write stays in slot 1"
        );
        s.reset(0);
        assert!(s.slots[0].iter().all(|&v| v == 0.0));
        assert_eq!(s.layer_mut(1, 2).0[0], 2.0);
    }
}
