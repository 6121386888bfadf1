"""A Fashion-MNIST classifier written in PyTorch, as you would for Lightning.

kiln trains it with no Python in the run: kiln_export.py exports its
training and evaluation programs (BatchNorm and Dropout differ between them)
and its weights to model.pt2, and the kiln_exported plugin runs them.
"""
import torch
from torch import nn


class FashionNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(32 * 7 * 7, 10))

    def forward(self, x):
        # kiln_fashion_mnist hands flat [N, 784] rows: an image again here.
        return self.head(self.features(x.view(-1, 1, 28, 28)))
