//! What one step tells the kernels about its varlen batch, packed into one `u32` buffer
//! so that a step costs one upload: per token its id, position, row and K/V slot; per
//! row where its block table starts and which packed token is its last; the block
//! tables themselves.

use crate::model::backend::RowInput;

/// The sections of a [`StepLayout`], in buffer order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Per token: its id.
    Ids,
    /// Per token: its position in its sequence.
    Positions,
    /// Per token: its row.
    Rows,
    /// Per token: the block its K/V go to.
    Blocks,
    /// Per token: the slot in that block.
    Slots,
    /// Per row: where its block table starts in [`Section::Tables`].
    RowTables,
    /// Per output: the packed index of a token whose logits the step returns (each row's
    /// last, or its last few in a verify step), rows in order.
    Last,
    /// The rows' block tables, one after another.
    Tables,
}

const SECTIONS: usize = 8;

#[derive(Debug, Clone)]
pub struct StepLayout {
    data: Vec<u32>,
    starts: [usize; SECTIONS + 1],
    tokens: usize,
    rows: usize,
    outputs: usize,
    /// The longest context a token of this step attends to.
    max_context: usize,
}

impl StepLayout {
    /// The layout of `rows`, whose K/V handles already hold blocks for every fed position,
    /// with outputs at the last `outputs[r]` tokens of row `r`.
    pub fn new(rows: &[RowInput<'_>], outputs: &[usize]) -> Self {
        let tokens: usize = rows.iter().map(|r| r.tokens.len()).sum();
        let table_len: usize = rows.iter().map(|r| r.kv.blocks().len()).sum();
        let mut sections: [Vec<u32>; SECTIONS] = Default::default();
        for per_token in &mut sections[..5] {
            per_token.reserve(tokens);
        }
        sections[Section::Tables as usize].reserve(table_len);
        let mut max_context = 0;
        for (r, row) in rows.iter().enumerate() {
            sections[Section::RowTables as usize].push(sections[Section::Tables as usize].len() as u32);
            sections[Section::Tables as usize].extend_from_slice(row.kv.blocks());
            for (i, &token) in row.tokens.iter().enumerate() {
                let position = row.start + i;
                let (block, slot) = row.kv.slot(position);
                sections[Section::Ids as usize].push(token);
                sections[Section::Positions as usize].push(position as u32);
                sections[Section::Rows as usize].push(r as u32);
                sections[Section::Blocks as usize].push(block);
                sections[Section::Slots as usize].push(slot as u32);
            }
            let end = sections[Section::Ids as usize].len() as u32;
            sections[Section::Last as usize].extend(end - outputs[r] as u32..end);
            max_context = max_context.max(row.start + row.tokens.len());
        }
        let mut starts = [0; SECTIONS + 1];
        let mut data = Vec::with_capacity(sections.iter().map(Vec::len).sum());
        for (s, section) in sections.iter().enumerate() {
            starts[s] = data.len();
            data.extend_from_slice(section);
        }
        starts[SECTIONS] = data.len();
        StepLayout { data, starts, tokens, rows: rows.len(), outputs: outputs.iter().sum(), max_context }
    }

    /// The whole buffer, as uploaded.
    pub fn data(&self) -> &[u32] {
        &self.data
    }

    /// Where `section` starts in [`data`](Self::data).
    pub fn offset(&self, section: Section) -> usize {
        self.starts[section as usize]
    }

    pub fn section(&self, section: Section) -> &[u32] {
        &self.data[self.starts[section as usize]..self.starts[section as usize + 1]]
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Positions whose logits the step returns.
    pub fn outputs(&self) -> usize {
        self.outputs
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv::{BlockPool, KvSeq};

    fn reserved(pool: &BlockPool, tokens: usize) -> KvSeq {
        let mut seq = pool.new_sequence();
        seq.reserve(tokens).unwrap();
        seq
    }

    /// What the attention kernel does to find a token's K/V: its row's table, entry
    /// position / block_size, slot position % block_size.
    fn kernel_slot(layout: &StepLayout, block_size: usize, t: usize, position: usize) -> (u32, u32) {
        let row = layout.section(Section::Rows)[t] as usize;
        let table = layout.section(Section::RowTables)[row] as usize;
        let block = layout.section(Section::Tables)[table + position / block_size];
        (block, (position % block_size) as u32)
    }

    #[test]
    fn every_token_finds_its_slot_and_its_rows_keys_through_the_tables() {
        let pool = BlockPool::paged(64, 4, false);
        // A prefill of 9, a decode at 13 and an extend of 3 from 6, as one step packs them.
        let (mut a, mut b, mut c) = (reserved(&pool, 9), reserved(&pool, 14), reserved(&pool, 9));
        let (ta, tb, tc): (Vec<u32>, Vec<u32>, Vec<u32>) = ((0..9).collect(), vec![42], vec![7, 8, 9]);
        let rows = [
            RowInput { kv: &mut a, tokens: &ta, start: 0 },
            RowInput { kv: &mut b, tokens: &tb, start: 13 },
            RowInput { kv: &mut c, tokens: &tc, start: 6 },
        ];
        let layout = StepLayout::new(&rows, &[1, 1, 1]);
        assert_eq!((layout.tokens(), layout.rows(), layout.max_context()), (13, 3, 14));
        assert_eq!(layout.section(Section::Last), &[8, 9, 12]);
        // A verify step reads the extend's every position.
        let verify = StepLayout::new(&rows, &[1, 1, 3]);
        assert_eq!((verify.outputs(), verify.section(Section::Last)), (5, &[8, 9, 10, 11, 12][..]));
        assert_eq!(layout.section(Section::Positions)[9..], [13, 6, 7, 8]);
        let ids: Vec<u32> = ta.iter().chain(&tb).chain(&tc).copied().collect();
        assert_eq!(layout.section(Section::Ids), ids.as_slice());
        for t in 0..layout.tokens() {
            let row = layout.section(Section::Rows)[t] as usize;
            let position = layout.section(Section::Positions)[t] as usize;
            let own = rows[row].kv.slot(position);
            let written = (layout.section(Section::Blocks)[t], layout.section(Section::Slots)[t]);
            assert_eq!(written, (own.0, own.1 as u32), "token {t}");
            // Every earlier position of the row resolves to the block the row holds there.
            for p in 0..=position {
                let expected = rows[row].kv.slot(p);
                assert_eq!(kernel_slot(&layout, 4, t, p), (expected.0, expected.1 as u32));
            }
        }
        // Sections tile the buffer in order.
        let total: usize = [Section::Ids, Section::Positions, Section::Rows, Section::Blocks, Section::Slots]
            .iter()
            .map(|&s| layout.section(s).len())
            .sum::<usize>()
            + layout.section(Section::RowTables).len()
            + layout.section(Section::Last).len()
            + layout.section(Section::Tables).len();
        assert_eq!(total, layout.data().len());
        assert_eq!(layout.offset(Section::Tables) + layout.section(Section::Tables).len(), layout.data().len());
    }
}
