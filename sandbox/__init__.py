"""Host side of the LIP sandbox: image build (:mod:`sandbox.image`) and launcher
(:mod:`sandbox.launcher`). The SDK that runs *inside* the sandbox is the ``symphony`` package
next to this file. Nothing here imports Django or the worker's engine."""
