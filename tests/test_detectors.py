import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_lightning.client import ClientContext, client_seed, train_client
from fl_lightning.config import FederationConfig, OptimizerConfig, TrainerConfig
from fl_lightning.data import ClientBatches, synthetic_dataset
from fl_lightning.models import FashionCNN
from fl_lightning.modules import StackedModel, stack_models
from fl_lightning.algorithms.fedova.detectors import detector_task
from tests.conftest import smoothed


def detector_network() -> torch.nn.Module:
    """FedOVA's detector CNN, smoothed: these tests train it along two code paths and compare
    the results exactly (``tests.conftest.smoothed`` says why ReLU and max pooling cannot be
    compared so on every CPU)."""
    return smoothed(FashionCNN(num_outputs=1))


@pytest.fixture(scope="module")
def setting():
    data = synthetic_dataset(300)
    torch.manual_seed(0)
    template = detector_network()
    stacked = stack_models([detector_network() for _ in range(3)])
    fed = FederationConfig(local_epochs=2, batch_size=32)
    ctx = ClientContext(data.train_x, data.train_y, template, fed, TrainerConfig(accelerator="cpu"), seed=7)
    indices = np.flatnonzero(np.isin(data.train_y.numpy(), [0, 1, 2]))
    return ctx, stacked, indices


@pytest.mark.parametrize("optimizer", [OptimizerConfig("sgd", lr=0.05, momentum=0.9), OptimizerConfig("adam", lr=1e-3),
                                       OptimizerConfig("fim_lbfgs", lr=0.1, history=3, damping=0.01, max_step_norm=1.0)])
def test_co_trained_detectors_equal_separately_trained_ones(setting, optimizer):
    ctx, stacked, indices = setting
    classes = (0, 1, 2)

    together = train_client(ctx, detector_task(4, stacked, classes, optimizer), indices, round_index=1)
    alone = [
        train_client(ctx, detector_task(4, {k: v[i:i + 1] for k, v in stacked.items()}, (c,), optimizer),
                     indices, round_index=1)
        for i, c in enumerate(classes)
    ]

    assert together.steps == alone[0].steps == 2 * int(np.ceil(len(indices) / 32))
    for i, single in enumerate(alone):
        for name in stacked:
            torch.testing.assert_close(together.params[name][i], single.params[name][0], rtol=1e-5, atol=1e-6)
        assert not torch.equal(together.params[name][i], stacked[name][i])  # it did train



def test_a_last_batch_of_one_sample_trains_every_detector(setting):
    # 33 samples in batches of 32: the last holds one sample (ATHENA-FL's code reading gives
    # clients local sets of any size); its (detectors, 1) logits keep their batch axis
    ctx, stacked, indices = setting

    result = train_client(ctx, detector_task(4, stacked, (0, 1, 2), OptimizerConfig("adam", lr=1e-3)), indices[:33], 1)

    assert result.steps == 2 * 2 and np.isfinite(result.train_loss)

def test_lightning_client_equals_a_plain_pytorch_loop(setting):
    ctx, stacked, indices = setting
    single = {k: v[:1] for k, v in stacked.items()}
    result = train_client(ctx, detector_task(2, single, (1,), OptimizerConfig("sgd", lr=0.05)), indices, 3)

    model = detector_network()
    model.load_state_dict({k: v[0] for k, v in single.items()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seed = client_seed(7, 3, 2)
    batches = ClientBatches(ctx.x, ctx.y, torch.from_numpy(indices), 32, torch.Generator().manual_seed(seed))
    for _ in range(2):
        for x, y in batches:
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(model(x).squeeze(-1), (y == 1).float()).backward()
            opt.step()

    for name, p in model.state_dict().items():
        torch.testing.assert_close(result.params[name][0], p, rtol=1e-5, atol=1e-6)


def test_vmap_and_loop_stacking_agree(setting):
    _, stacked, _ = setting
    x = torch.randn(8, 1, 28, 28)
    template = FashionCNN(num_outputs=1)
    out_loop = StackedModel(template, stacked, mode="loop")(x)
    out_vmap = StackedModel(template, stacked, mode="vmap")(x)
    assert out_loop.shape == (3, 8, 1)
    torch.testing.assert_close(out_loop, out_vmap, rtol=1e-5, atol=1e-5)


def test_client_batches_visit_every_local_sample_once_per_epoch():
    x, y = torch.arange(50).float().view(50, 1), torch.zeros(50, dtype=torch.long)
    indices = torch.arange(10, 47)
    batches = ClientBatches(x, y, indices, 10, torch.Generator().manual_seed(0))
    seen = torch.cat([xb.view(-1) for xb, _ in batches]).long()
    assert len(batches) == 4 and sorted(seen.tolist()) == list(range(10, 47))
    full = ClientBatches(x, y, indices, 0, torch.Generator().manual_seed(0))
    assert len(full) == 1 and next(iter(full))[0].shape[0] == 37


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_vmap_detectors_match_cpu_loop(setting):
    _, stacked, _ = setting
    x = torch.randn(64, 1, 28, 28)
    template = FashionCNN(num_outputs=1)
    cpu = StackedModel(template, stacked, mode="loop")(x)
    gpu = StackedModel(template, stacked, mode="vmap").cuda()(x.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-3, atol=1e-3)  # TF32 convolutions on the GPU
