"""`eyrie export specforge OUTPUT_URI DIR` and `eyrie export specforge-online OUTPUT_URI DIR`."""

from __future__ import annotations

import argparse
import shlex


def export_main(argv: list[str]) -> int:
    if argv and argv[0] == "specforge-online":
        return export_online_main(argv[1:])
    p = argparse.ArgumentParser(prog="eyrie export", description="Export extracted hidden states (specforge), or "
                                "the samples for SpecForge's online training (specforge-online: see "
                                "`eyrie export specforge-online --help`).")
    p.add_argument("format", choices=["specforge", "specforge-online"],
                   help="specforge: SpecForge's offline EAGLE-3 data (hidden states); specforge-online: its online "
                        "input (no hidden states)")
    p.add_argument("output_uri", help="the run's output (file://, path or s3://; S3 via EYRIE_S3_* env)")
    p.add_argument("dir", help="local folder to write into (empty, or an earlier export with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="remove an earlier export in DIR first")
    p.add_argument("--max-length", type=int, metavar="N",
                   help="the trainer's max_len: report how many samples are longer (SpecForge cuts them silently)")
    p.add_argument("--truncate", action="store_true", help="cut samples longer than --max-length (loss mask alike)")
    p.add_argument("--model", metavar="REF", help="the target model (folder or HF id) whose config.json shapes "
                                                  "draft-config.json (default: the model the run extracted with)")
    p.add_argument("--trust-remote-code", action="store_true", help="the model's config needs its own code")
    args = p.parse_args(argv)
    if args.max_length is not None and args.max_length < 1:
        p.error("--max-length must be at least 1")

    from eyrie.jobs.extract.specforge import DRAFT_CONFIG, RUN_CONFIG, TRAIN_INSTALL, ExportOptions, export_specforge
    from eyrie.jobs.store import open_store

    opts = ExportOptions(overwrite=args.overwrite, max_length=args.max_length, truncate=args.truncate,
                         model=args.model, trust_remote_code=args.trust_remote_code)
    r = export_specforge(open_store(args.output_uri), args.dir, opts)
    print(f"wrote {r.samples} samples to {args.dir} (bfloat16 from stored {r.stored_dtype}; aux layers "
          f"{r.aux_layers} = SpecForge eagle_aux_hidden_state_layer_ids {[i - 1 for i in r.aux_layers]})")
    if args.max_length:
        verb = "cut to" if args.truncate else "longer than"
        print(f"{r.over_max_length} of {r.samples} samples {verb} {args.max_length} tokens"
              + ("" if args.truncate or not r.over_max_length else
                 " (SpecForge will cut them at max_len; --truncate cuts them here, loss mask alike)"))
    if r.draft_config:
        print(f"wrote {DRAFT_CONFIG} (an EAGLE-3 draft of the target's shape) and {RUN_CONFIG} (target "
              f"{r.target_model_path}); train in SpecForge's own environment ({TRAIN_INSTALL}), from the folder: "
              f"cd {shlex.quote(args.dir)} && ~/specforge-env/bin/specforge train -c {RUN_CONFIG} "
              f"output_dir={shlex.quote(r.output_dir or '')}  (checkpoints beside the export, never in it)")
    else:
        print(f"no {DRAFT_CONFIG}: the target's config could not be read ({r.draft_error}); pass --model, or let "
              f"SpecForge derive the draft from model.target_model_path in {RUN_CONFIG}")
    return 0


def export_online_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="eyrie export specforge-online",
        description="Write the run's samples as SpecForge's online training reads them (preformatted text, and the "
                    "token ids as they are), each row checked by SpecForge's own parser: no hidden states stored.")
    p.add_argument("output_uri", help="the run's output (file://, path or s3://; S3 via EYRIE_S3_* env)")
    p.add_argument("dir", help="local folder to write into (empty, or an earlier export with --overwrite)")
    p.add_argument("--chat-template", metavar="NAME",
                   help="SpecForge's data.chat_template (default: chosen among SpecForge's templates for the "
                        "samples' chat format, by what rebuilds the first rows exactly)")
    verify = p.add_mutually_exclusive_group()
    verify.add_argument("--verify", dest="verify", action="store_true", default=None,
                        help="run every row through SpecForge's parser (the default when specforge imports)")
    verify.add_argument("--no-verify", dest="verify", action="store_false", help="write the rows unchecked")
    p.add_argument("--keep-mismatched", action="store_true",
                   help="keep rows SpecForge rebuilds differently in data.jsonl (counted all the same)")
    p.add_argument("--max-length", type=int, metavar="N",
                   help="SpecForge's data.max_length (default: the longest sample); longer rows are left out")
    p.add_argument("--truncate", action="store_true", help="cut rows longer than --max-length instead")
    p.add_argument("--tokenizer", metavar="REF",
                   help="load the tokenizer from here instead of the run's target.tokenizer (its files must match)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="the tokenizer needs its own code (SpecForge's model.trust_remote_code: true)")
    p.add_argument("--model", metavar="REF",
                   help="the target model (folder or HF id; its config.json is read): also write vocab-mapping.pt "
                        "and draft-config.json, which SpecForge's online training needs (model.vocab_mapping_path)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="processes running SpecForge's parser (default: one per core, each with at least 5,000 rows; "
                        "fewer rows are parsed in this process)")
    p.add_argument("--overwrite", action="store_true", help="remove an earlier export in DIR first")
    args = p.parse_args(argv)
    for name in ("max_length", "workers"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")

    from eyrie.jobs.extract.specforge_online import OnlineOptions, export_specforge_online
    from eyrie.jobs.store import open_store

    opts = OnlineOptions(chat_template=args.chat_template, verify=args.verify, keep_mismatched=args.keep_mismatched,
                         max_length=args.max_length, truncate=args.truncate, overwrite=args.overwrite,
                         tokenizer=args.tokenizer, trust_remote_code=args.trust_remote_code, workers=args.workers,
                         model=args.model)
    r = export_specforge_online(open_store(args.output_uri), args.dir, opts)
    print(online_summary(r.summary))
    return 0


def online_summary(s: dict) -> str:
    """What the online export wrote and how SpecForge reads it, in a few lines."""
    lines = [f"wrote {s['written']} of {s['samples']} samples to {s['dir']}/data.jsonl (chat template "
             f"{s['chatTemplate']}, {s['chosenBy']}; max_length {s['maxLength']}) and all {s['samples']} as token "
             "ids to tokens.jsonl"]
    if not s["verified"]:
        lines.append(f"not verified: SpecForge's parser was not run ({s.get('notVerified') or '--no-verify'})")
    else:
        lines.append(f"SpecForge {s['specforgeVersion']} will train on {s['exact']} of {s['samples']} rows exactly as "
                     f"eyrie rebuilt them" + (f" ({s['truncated']} of them cut at max_length)" if s["truncated"]
                                              else ""))
    for cause, n in s["mismatched"].items():
        lines.append(f"  {n} {cause}: {s['causes'][cause]}")
    if s.get("parserCpuSeconds") is not None and s.get("cpuSeconds"):
        lines.append(f"CPU: {s['cpuSeconds']:.1f} s (this process and its parser processes: {s['workers']}), "
                     f"{s['parserCpuSeconds']:.1f} s of it ({s['parserCpuSeconds'] / s['cpuSeconds']:.0%}) inside "
                     "SpecForge's own parser")
    first = next((e for e in s["examples"] if "eyrie" in e), None)
    if first:
        lines += [f"first difference: sample {first['id']} at token {first['position']} ({first['cause']}); "
                  "loss marked ⟦ ⟧:", f"  eyrie:     {first['eyrie']!r}", f"  SpecForge: {first['specforge']!r}"]
    if s.get("files", {}).get("vocabMapping"):
        lines.append(f"wrote vocab-mapping.pt (a {s['draftVocabSize']}-token draft vocabulary from the loss tokens, by "
                     f"SpecForge's own code) and draft-config.json for {s['model']}")
    else:
        lines.append("no vocab-mapping.pt: SpecForge's online training needs one (model.vocab_mapping_path); export "
                     "with --model REF, the target model")
    lines.append("train: data-config.yaml (text) or data-config-tokens.yaml (the ids as they are) is the model and "
                 "data section of a `specforge train -c CONFIG` run config, its paths relative to the folder: run it "
                 "from there, in SpecForge's own environment (docs/operating.md, Train a drafter)")
    return "\n".join(lines)
