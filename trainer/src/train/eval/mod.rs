//! Held-out evaluation: the accuracy of the model's greedy answers, per question type of the
//! synthetic shapes set ([`crate::train::data::synth`]), next to the accuracy of guessing.
//!
//! Greedy decoding answers a prompt by appending, one at a time, the argmax token of the logits
//! at the last position until it emits `</s>`. Its answer equals the reference answer exactly
//! when, at every position of the reference answer (and of its `</s>`), the argmax of the
//! logits given the reference prefix is the reference token: as long as the greedy answer
//! agrees with the reference, its prefix *is* the reference prefix, and the first position
//! where they differ makes it wrong. So one teacher-forced forward pass over a padded batch of
//! held-out samples scores their greedy answers exactly, with no decoding loop and no KV
//! cache; what the model wrote instead is read off the same logits for the report.
//!
//! A prompt whose question is not one of the synthetic set's counts under [`Kind::Other`],
//! which has no chance figure.
//!
//! The validation loss during training (`train.eval_every`) is [`loss`]'s.

pub mod loss;
pub(crate) mod score;
pub mod sharded;

use crate::model::batch::Batch;
use crate::model::{ActElem, Mistral3, ModelError};
use crate::train::data::dataset::DataSet;
use crate::train::data::image::ImageConfig;
use crate::train::data::{DataError, Tekken};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("evaluation data: {0}")]
    Data(#[from] DataError),
    #[error("evaluation forward: {0}")]
    Model(#[from] ModelError),
    #[error("evaluation: {0}")]
    Input(String),
}

/// The question types of the synthetic shapes set, and everything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// "What colour is the {shape}?": one of 6 colours.
    Colour,
    /// "How many shapes are there?": 1, 2 or 3.
    Count,
    /// "What shape is {colour}?": circle, square or triangle.
    Shape,
    /// "Which image has a {shape}?" over two images: first or second.
    WhichImage,
    /// Any other question.
    Other,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Colour,
        Kind::Count,
        Kind::Shape,
        Kind::WhichImage,
        Kind::Other,
    ];

    /// The type of a prompt, from the question stems [`crate::train::data::synth::sample`] writes.
    pub fn classify(prompt: &str) -> Kind {
        if prompt.contains("What colour is the") {
            Kind::Colour
        } else if prompt.contains("How many shapes are there") {
            Kind::Count
        } else if prompt.contains("What shape is") {
            Kind::Shape
        } else if prompt.contains("Which image has a") {
            Kind::WhichImage
        } else {
            Kind::Other
        }
    }

    /// The accuracy of answering uniformly at random among the type's possible answers (the
    /// synthetic set draws the asked attribute uniformly, so this is also the best a model
    /// blind to the image can do on average).
    pub fn chance(self) -> Option<f64> {
        match self {
            Kind::Colour => Some(1.0 / crate::train::data::synth::COLOURS.len() as f64),
            Kind::Count | Kind::Shape => Some(1.0 / 3.0),
            Kind::WhichImage => Some(0.5),
            Kind::Other => None,
        }
    }

    /// The accuracy the built-in default must reach: error at most a third of chance's,
    /// `1 - (1 - chance) / 3`.
    pub fn target(self) -> Option<f64> {
        self.chance().map(|c| 1.0 - (1.0 - c) / 3.0)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Colour => "colour",
            Kind::Count => "count",
            Kind::Shape => "shape",
            Kind::WhichImage => "which_image",
            Kind::Other => "other",
        }
    }
}

/// The score of one question type.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KindScore {
    pub kind: Kind,
    pub correct: usize,
    pub total: usize,
    pub accuracy: f64,
    pub chance: Option<f64>,
    /// Accuracy the default must reach on this type (error <= chance's / 3).
    pub target: Option<f64>,
}

/// One held-out sample's outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Answer {
    /// 1-based line of the sample in the held-out file.
    pub line: usize,
    pub kind: Kind,
    pub expected: String,
    /// What greedy decoding wrote up to the first wrong token (that token included).
    pub got: String,
    pub correct: bool,
}

/// Accuracy per question type (types with no sample left out).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EvalReport {
    pub samples: usize,
    pub correct: usize,
    /// Held-out samples left out because an image failed to decode (a file cut after its
    /// header: the set is read by headers only, see `DataSet::open`).
    pub skipped: usize,
    pub per_kind: Vec<KindScore>,
    #[serde(skip)]
    pub answers: Vec<Answer>,
}

impl EvalReport {
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.samples.max(1) as f64
    }

    /// True when every type with a chance figure reaches its target.
    pub fn meets_targets(&self) -> bool {
        self.per_kind
            .iter()
            .all(|k| k.target.is_none_or(|t| k.accuracy >= t))
    }

    /// A table: type, samples, accuracy, chance, target.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<12} {:>7} {:>9} {:>8} {:>8}\n",
            "question", "samples", "accuracy", "chance", "target"
        );
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.1}%", 100.0 * x));
        for k in &self.per_kind {
            s += &format!(
                "{:<12} {:>7} {:>9} {:>8} {:>8}\n",
                k.kind.name(),
                k.total,
                pct(Some(k.accuracy)),
                pct(k.chance),
                pct(k.target)
            );
        }
        s += &format!(
            "{:<12} {:>7} {:>9}\n",
            "all",
            self.samples,
            pct(Some(self.accuracy()))
        );
        s
    }
}

/// Scores the greedy answers of `model` (one process, the whole model) on every sample of
/// `data` (read with `tok`), `rows` samples per forward pass, images processed with
/// `image_cfg`. Activations at precision `A`. The ranks of a run score on their shards
/// instead ([`sharded::evaluate_on`]).
pub fn evaluate<A: ActElem>(
    model: &Mistral3,
    data: &DataSet,
    tok: &Tekken,
    image_cfg: &ImageConfig,
    rows: usize,
) -> Result<EvalReport, EvalError> {
    let vocab = model.cfg.text_config.vocab_size;
    let mut forward = |batch: Option<&Batch>| -> Result<Option<Vec<u32>>, EvalError> {
        let Some(batch) = batch else {
            return Ok(None);
        };
        // The logits alone: no backward follows, so no gradient of them.
        let pass = crate::model::ModelPass {
            logits: crate::model::Logits::Kept,
            ..model.pass()
        };
        let acts = pass.forward::<A>(batch)?;
        let logits = acts
            .logits()
            .ok_or_else(|| EvalError::Input("evaluation needs the full-logits loss mode".into()))?;
        let ids = score::greedy_ids(logits, vocab, model.exec.stream());
        Ok(Some(ids.map_err(ModelError::from)?))
    };
    score::evaluate_chunks(data, tok, rows, |chunk| {
        score::score_rows(chunk, image_cfg, tok.pad_id(), &data.path, &mut forward)
    })
}

/// Index of the largest value (the first on ties, as torch.argmax); NaN never wins.
fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] || x[best].is_nan() {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_synthetic_questions() {
        let mut rng = crate::train::data::shuffle::SplitMix64::new(4);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let s = crate::train::data::synth::sample(&mut rng);
            let k = Kind::classify(&s.question);
            assert_ne!(k, Kind::Other, "{}", s.question);
            seen.insert(k);
        }
        assert_eq!(seen.len(), 4);
        assert_eq!(Kind::classify("What is this?"), Kind::Other);
        // The examples: >= 72 % where chance is 1/6, >= 78 % where it is 1/3.
        assert!((Kind::Colour.target().unwrap() - 0.7222).abs() < 1e-4);
        assert!((Kind::Count.target().unwrap() - 0.7778).abs() < 1e-4);
    }

    #[test]
    fn argmax_takes_the_first_largest() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, 1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
    }
}
