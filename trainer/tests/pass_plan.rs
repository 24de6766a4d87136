//! The model's passes fetch and release groups exactly in the order `GroupOrder` states (the
//! order a sharded rank's collectives follow), for every freezing, with and without images
//! and with the pixel gradient asked for: a recording source and sink around the model's own
//! parameters and gradients compare the calls with the plan.

mod fsdp_fixture;

use cannon_runtime::BufferViewMut;
use cannon_trainer::model::source::{BackwardStep, PlanInputs};
use cannon_trainer::model::{
    GradSink, GroupOrder, GroupWeights, ModelError, ParamLayout, ParamSource, Params, Part,
};
use cannon_trainer::model::{Grads, ModelPass};
use fsdp_fixture::*;
use std::cell::RefCell;

/// Records every fetch, then serves the group from the model's parameters.
struct Recorder<'a> {
    params: &'a Params,
    fetched: RefCell<Vec<usize>>,
}

impl ParamSource for Recorder<'_> {
    fn layout(&self) -> &ParamLayout {
        &self.params.layout
    }

    fn fetch(&self, g: usize) -> Result<GroupWeights<'_>, ModelError> {
        self.fetched.borrow_mut().push(g);
        self.params.fetch(g)
    }
}

/// Records every release of a trained group.
struct Releases<'a> {
    grads: &'a mut Grads,
    released: Vec<usize>,
}

impl GradSink for Releases<'_> {
    fn trains(&self, g: usize) -> bool {
        self.grads.trains(g)
    }

    fn grad(&mut self, g: usize) -> Result<Option<BufferViewMut<'_, f32>>, ModelError> {
        self.grads.grad(g)
    }

    fn release(&mut self, g: usize) -> Result<(), ModelError> {
        if self.grads.trains(g) {
            self.released.push(g);
        }
        Ok(())
    }
}

#[test]
fn passes_fetch_and_release_in_plan_order() {
    let cfg = config();
    let host = init(&cfg, 2);
    let m = model(&cfg, &host);
    let layout = &m.params.layout;
    let mut rng = cannon_runtime::rng::SplitMix64::new(4);
    let parts = [Part::Vision, Part::Projector, Part::Text];
    let mut checked = 0;
    for mask in 0..8u32 {
        let trained: Vec<Part> = (0..3)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| parts[i])
            .collect();
        for images in [true, false] {
            for dpixels in [false, true] {
                if dpixels && !images {
                    continue;
                }
                let batch = micro_batch(&mut rng, images, false);
                let mut grads = m.grads(&trained).unwrap();
                let trains = |g: usize| trained.contains(&layout.groups[g].part);
                let inputs = PlanInputs {
                    trains: &trains,
                    images,
                    dpixels,
                };
                let plan = GroupOrder::new(&cfg, layout, inputs);
                let rec = Recorder {
                    params: &m.params,
                    fetched: RefCell::new(Vec::new()),
                };
                let pass = ModelPass {
                    params: &rec,
                    ..m.pass()
                };
                let acts = pass.forward::<f32>(&batch).unwrap();
                let what = format!("trained {trained:?}, images {images}, dpixels {dpixels}");
                assert_eq!(*rec.fetched.borrow(), plan.forward, "{what}: forward");
                rec.fetched.borrow_mut().clear();
                let mut dpix =
                    dpixels.then(|| m.exec.zeros(&[batch.images.pixel_values.len()]).unwrap());
                let mut sink = Releases {
                    grads: &mut grads,
                    released: Vec::new(),
                };
                pass.backward(&batch, &acts, &mut sink, dpix.as_mut())
                    .unwrap();
                let pick = |f: fn(&BackwardStep) -> bool| -> Vec<usize> {
                    plan.backward
                        .iter()
                        .filter(|s| f(s))
                        .map(|s| s.group)
                        .collect()
                };
                assert_eq!(*rec.fetched.borrow(), pick(|s| s.fetch), "{what}: fetches");
                assert_eq!(sink.released, pick(|s| s.release), "{what}: releases");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 8 * 3);
}
