"""The GGUF layer: header parser, validated hyper-parameters and tensors, quant blocks. No OpenVINO."""
