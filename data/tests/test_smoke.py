import torch
import gem_data

def test_import() -> None:
    assert gem_data.__version__ == "0.1.0"
    assert torch.ones(2).sum().item() == 2
