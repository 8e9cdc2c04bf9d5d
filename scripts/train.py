"""Train a Hugging Face causal LM: a shim of `python -m zero_train.train`, for launchers given a script path.

    deepspeed --num_gpus 2 scripts/train.py --deepspeed_config ds_configs/zero2.json --engine ds2 --model tiny
    torchrun --nproc_per_node 2 scripts/train.py --engine zero2 --model tiny --max-steps 30
    # several machines: DeepSpeed's hostfile launcher (one line per host: `worker-1 slots=8`)
    deepspeed --hostfile hostfile --master_addr worker-1 --master_port 29500 scripts/train.py \
        --deepspeed_config ds_configs/zero3.json --engine ds3 --model gpt2-small

Every engine and flag: `python -m zero_train.train --help`, docs/launch.md.
"""

from zero_train.train.main import main

if __name__ == "__main__":
    main(prog="train.py")
