"""The Hugging Face Trainer on train.py's flags: a shim of `python -m zero_train.bench.peer_main`.

    # the Trainer with the same DeepSpeed config (here ZeRO-1), model and data as train.py
    deepspeed --num_gpus 2 scripts/hf_trainer.py --deepspeed_config ds_configs/zero1.json --engine ds1 \
        --model gpt2-25m --max-steps 8 --metrics-file hf.jsonl --memory-report hf.json
    # the Trainer without DeepSpeed (its own DDP)
    torchrun --nproc_per_node 2 scripts/hf_trainer.py --engine ddp --model gpt2-25m --max-steps 8
"""

from zero_train.bench.peer_main import main

if __name__ == "__main__":
    main(prog="hf_trainer.py")
