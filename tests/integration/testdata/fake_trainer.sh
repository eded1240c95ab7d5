#!/bin/sh
# A stand-in for depthbench-train where a test exercises the worker's
# connection to the scheduler, not training: the JSON-line events of
# trainer_core/README.md for one step and a successful end, whatever the
# arguments.
echo '{"event":"start","step":0}'
echo '{"event":"step","step":1,"loss":3.0,"lr":0.001,"grad_norm":1.0,"tokens_per_s":100}'
echo '{"event":"done","step":1,"status":"succeeded","val_loss":2.5}'
