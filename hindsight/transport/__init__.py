"""Weight transport: how a new weights version reaches the rollout engines. One contract
(`base.WeightSender`: publish a version and wait for every receiver's ack; a receiver applies
it with `base.receive` and acks), four ways to move it:

- in process (`inprocess`): the receivers share the learner's model object; only the version moves;
- Ray (`ray`): one payload put into Ray's object store, read by every rollout actor;
- pipe (`pipe`): safetensors bytes over a pipe to the async sampler's process, acks back on its
  result pipe;
- vLLM (`vllm`): buckets of tensors into a resident engine through `collective_rpc`.

Every payload that carries tensors carries their checksum, and the receiver checks it before it
serves anything from them (`payload`). Adding a transport is one file here.
"""
