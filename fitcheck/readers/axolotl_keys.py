"""The axolotl config keys fitcheck knows (commit ``067b021c8b87a9e5e380b9173c704cf7340e30f5``): which are
translated (``readers/axolotl.py``), which change a step's memory and are refused with the reason, and which
change nothing a training step allocates on the GPU. Any other key is listed once as unknown.
"""

from __future__ import annotations

LIGER_SWITCHES = {  # axolotl integrations/liger/args.py -> transformers liger_kernel_config keys
    "liger_rope": "rope",
    "liger_rms_norm": "rms_norm",
    "liger_glu_activation": "swiglu",
    "liger_swiglu": "swiglu",
    "liger_fused_linear_cross_entropy": "fused_linear_cross_entropy",
    "liger_cross_entropy": "cross_entropy",
}

# Keys that change what a step allocates and that fitcheck does not model: refused when set (truthy).
REFUSED: dict[str, str] = {
    "chunked_cross_entropy": "axolotl's own chunked cross-entropy (loaders/patch_manager.py "
    "_apply_chunked_cross_entropy_patch) is not modelled; use the Cut Cross-Entropy plugin (--loss cce) or the "
    "Liger plugin with liger_fused_linear_cross_entropy, or drop the key",
    "chunked_cross_entropy_num_chunks": "belongs to chunked_cross_entropy, which is not modelled",
    # axolotl@067b021 loaders/model.py L225-228 passes use_kernels to from_pretrained; transformers 5.23
    # modeling_utils.py set_use_kernels -> integrations/hub_kernels.py kernelize: in training mode on CUDA the
    # default mapping swaps GptOssMLP for kernels-community/megablocks MegaBlocksMoeMLP v1, every RMSNorm for
    # kernels-community/liger-kernels LigerRMSNorm v3 and ForCausalLMLoss for LigerForCausalLMLossLayer v3.
    # Those are Hub builds fetched at kernelize time: their source is in no pinned package (the `kernels` package
    # itself is not in the stack), so what MegaBlocks' dropless MoE saves for backward cannot be read or traced.
    "use_kernels": "transformers' kernelize swaps in Hub kernels (gpt-oss: MegaBlocks' MoE MLP, Liger's RMSNorm "
    "and loss from kernels-community builds fetched at run time, in no pinned package), whose saved tensors "
    "cannot be read from source or traced; set use_kernels: false",
    "tiled_mlp": "axolotl's tiled MLP (ALST) recomputes the MLP in tiles; not modelled",
    "layer_offloading": "parameters offloaded to CPU between layers are not modelled",
    "selective_checkpointing": "selective activation checkpointing (saved attention ops) is not modelled",
    "qat": "quantization-aware training (fake-quant weights and activations) is not modelled",
    "fp8": "fp8 training (torchao Float8Linear) is not modelled",
    "relora": "ReLoRA (periodic merges) is not modelled",
    "lisa_n_layers": "LISA layer sampling is not modelled",
    "gptq": "a GPTQ base model is not modelled (bitsandbytes 4/8-bit is)",
    "unfrozen_parameters": "regex parameter freezing is not translated; pass --trainable_parameters patterns "
    "instead of the file key",
    "sequence_parallel_degree": "axolotl's sequence parallelism is not translated; pass --sp_size/--cp_size",
    "context_parallel_size": "axolotl's context parallelism is not translated; pass --cp_size and --num_processes",
    "tensor_parallel_size": "axolotl's tensor parallelism is not translated; pass --tp_size and --num_processes",
    "dp_shard_size": "axolotl's ParallelismConfig is not translated; pass --dp_shard_size and --num_processes",
    "dp_replicate_size": "axolotl's ParallelismConfig is not translated; pass --dp_replicate_size",
    "expert_parallel_size": "expert parallelism is not modelled",
    "quantize_moe_experts": "quantized MoE experts are not modelled",
    "peft_layer_replication": "LoRA layer replication is not modelled",
    "dpo_use_liger_kernel": "TRL's Liger DPO loss is not modelled",
    "dpo_padding_free": "padding-free DPO batches are not modelled",
    "use_eaft": "the EAFT loss (entropy over full logits) is not modelled",
    "lora_on_cpu": "LoRA loaded on CPU is not modelled",
    "load_in_2bit": "2-bit loading is not modelled",
    "flash_attn_cross_entropy": "flash-attention's cross-entropy kernel is not modelled",
    "flash_attn_fuse_mlp": "flash-attention's fused MLP is not modelled",
    "gradient_checkpointing_offload": "offloaded checkpoints are not modelled",
    "llama4_linearized_experts": "linearized experts are not modelled",
}

# Keys read and known to change nothing a training step allocates on the GPU (data, logging, saving, schedule,
# tokenizer, hub, evaluation cadence, loading-only switches).
NO_MEMORY = frozenset([
    "datasets", "eval_batch_size", "test_datasets",
    "val_set_size", "dataset_prepared_path", "dataset_processes", "dataset_num_proc",
    "dataset_exact_deduplication", "shuffle_merged_datasets", "shuffle_before_merging_datasets",
    "push_dataset_to_hub", "hf_use_auth_token", "output_dir", "wandb_project", "wandb_entity", "wandb_watch",
    "wandb_name", "wandb_log_model", "wandb_run_id", "mlflow_tracking_uri", "mlflow_experiment_name",
    "comet_api_key", "comet_workspace", "comet_project_name", "trackio_project_name", "trackio_run_name",
    "trackio_space_id", "use_tensorboard", "use_wandb", "use_mlflow", "num_epochs", "max_steps", "lr_scheduler",
    "lr_scheduler_kwargs", "learning_rate", "lr_quadratic_warmup", "cosine_min_lr_ratio",
    "cosine_constant_lr_ratio", "lr_div_factor", "warmup_steps", "warmup_ratio", "logging_steps", "evals_per_epoch",
    "eval_steps", "saves_per_epoch", "save_steps", "save_strategy", "save_total_limit", "save_only_model",
    "save_safetensors", "save_first_step", "eval_strategy", "weight_decay", "adam_beta1", "adam_beta2",
    "adam_beta3", "adam_epsilon", "adam_epsilon2", "max_grad_norm", "special_tokens", "tokens", "eot_tokens",
    "chat_template", "chat_template_jinja", "default_system_message", "tokenizer_type", "tokenizer_config",
    "tokenizer_use_fast", "tokenizer_legacy", "tokenizer_use_mistral_common", "tokenizer_save_jinja_files",
    "model_type", "model_revision", "trust_remote_code", "resume_from_checkpoint", "auto_resume_from_checkpoints",
    "lora_model_dir", "loss_watchdog_threshold", "loss_watchdog_patience", "tf32", "strict", "seed",
    "train_on_inputs", "group_by_length", "hub_model_id", "hub_strategy", "hub_revision", "remove_unused_columns",
    "kto_desirable_weight", "kto_undesirable_weight", "eval_sample_packing", "eval_table_size",
    "eval_max_new_tokens", "do_causal_lm_eval", "eval_causal_lm_metrics", "pad_to_sequence_len",
    "sample_packing_eff_est", "sample_packing_group_size", "sample_packing_bin_size", "sample_packing_sequentially",
    "multipack_real_batches", "debug_num_examples", "experimental_skip_move_to_device", "low_cpu_mem_usage",
    "device_map", "max_memory", "is_llama_derived_model", "is_mistral_derived_model", "is_falcon_derived_model",
    "is_qwen_derived_model", "ddp_timeout", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_prefetch_factor", "dataloader_drop_last", "early_stopping_patience",
    "neftune_noise_alpha", "loraplus_lr_ratio", "loraplus_lr_embedding", "lora_fan_in_fan_out",
    "peft_init_lora_weights", "flash_attn_rms_norm", "dpo_label_smoothing", "dpo_use_weighting", "dpo_loss_weights",
    "rl_adapter_ref_model", "embedding_lr", "embedding_lr_scale", "skip_prepare_dataset", "streaming",
    "shrink_embeddings", "resize_token_embeddings_to_32x", "mean_resizing_embeddings", "unfrozen_parameters_regex",
    "excess_length_strategy", "min_sample_len", "eval_sequence_len", "torch_compile_mode", "torch_compile_backend",
    "gc_steps", "plugins", "profiler_steps", "include_tokens_per_second", "include_tkps", "use_ray",
    "ray_num_workers", "ray_run_name", "fix_untrained_tokens", "processor_type", "processor_config",
    "fitcheck_stop_if_not_fits", "fitcheck_gpu", "fitcheck_gpu_memory", "fitcheck_num_processes",
])
# Read below (mapped, or checked and then refused/accepted by value).
MAPPED = frozenset([
    "base_model", "base_model_config", "micro_batch_size", "gradient_accumulation_steps", "batch_size",
    "sequence_len", "bf16", "fp16", "bfloat16", "float16", "float32", "optimizer", "optim_args",
    "optim_target_modules", "gradient_checkpointing", "gradient_checkpointing_kwargs", "activation_offloading",
    "attn_implementation", "flash_attention", "sdp_attention", "eager_attention", "xformers_attention",
    "flex_attention", "sage_attention", "adapter", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
    "lora_target_linear", "lora_target_parameters", "lora_modules_to_save", "peft_layers_to_transform",
    "peft_use_dora", "peft_use_rslora", "load_in_4bit", "load_in_8bit", "bnb_config_kwargs", "deepspeed", "fsdp",
    "fsdp_config", "fsdp_version", "rl", "rl_beta", "trl", "max_prompt_len", "dpo_loss_type",
    "precompute_ref_log_probs", "sample_packing", "torch_compile", "cut_cross_entropy", "lora_mlp_kernel",
    "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel", "model_quantization_config",
    "model_quantization_config_kwargs", "liger_rms_norm_gated", "liger_layer_norm",
    "liger_use_token_scaling",
]) | frozenset(LIGER_SWITCHES)
