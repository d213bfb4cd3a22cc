"""The C statements of a frozen forward prefix computed patch by patch (compiler/graph/tiling.py's node).

The node's plan gives, per output tile, every tensor's region and each operand's crop and zero padding; the
patch buffers sit in the node's workspace at the plan's offsets. Per tile and op: each operand that is not
its patch as it is gets gathered (runtime/c/kernels/patch.h), the op's kernel runs on the patches (a
convolution with its padding made explicit), and the last patch is placed into the output. An input batch read
from storage (compiler/graph/input_storage.py) is gathered through the plan's reader instead: each patch's rows
straight from where the batch lies into the patch buffer. An int8 prefix's plan has its own function
(`emit_q8_patches`): its patches a byte an element, its kernels the q8 ones.
"""
from __future__ import annotations

import json

from .emitters import EmitError
from .names import c_comment, c_float


def _count(shape_n: int, c: int, r) -> int:
    return shape_n * c * (r[1] - r[0]) * (r[3] - r[2])


def _conv_shape(n: int, shapes, i: int, g: dict, r, op: dict, kernel) -> str:
    """A tile's convolution shape as a C designated initializer: its operand patch (padding made explicit, so
    none left) into output region `r` of tensor i + 1 (float and int8 patches alike)."""
    kh, kw = kernel
    fields = dict(n=n, c_in=shapes[g["from"]][1], h_in=g["pad"][0] + g["crop"][1] + g["pad"][1],
                  w_in=g["pad"][2] + g["crop"][3] + g["pad"][3], c_out=shapes[i + 1][1], h_out=r[1] - r[0],
                  w_out=r[3] - r[2], k_h=kh, k_w=kw, stride_h=op["stride"][0], stride_w=op["stride"][1],
                  pad_h=0, pad_w=0, dil_h=op["dilation"][0], dil_w=op["dilation"][1], groups=op["groups"])
    return ", ".join(f".{k} = {v}" for k, v in fields.items())


def emit_patches(node, offsets: dict[str, int], ctx, param_shapes: dict, reader: str | None = None) -> list[str]:
    """`node` (op edgetrain.patch_forward) as C: its input at `offsets[input]` (or, with `reader`, the C expression
    of an `et_input_reader *`, read from storage), its output at `offsets[name]`, its workspace at
    `offsets[name + ".patches"]` (arena words); `ctx`: parameter identifiers; `param_shapes`: the schedule's
    parameter shapes."""
    plan = json.loads(node.attrs["args"][2])
    params = node.params
    shapes, ops = plan["tensors"], plan["ops"]
    m = len(shapes) - 1
    base_in = None if reader else offsets[node.inputs[0].name]
    base_out, ws = offsets[node.name], offsets[f"{node.name}.patches"]
    buf = plan["buffers"]
    n = shapes[0][0]
    lines = [f"/* {len(plan['tiles'])} tiles of {c_comment(', '.join(plan['replaces']))} */"]
    for k, tile in enumerate(plan["tiles"]):
        reg = tile["regions"]
        y0, y1, x0, x1 = reg[m]
        lines.append(f"/* tile {k}: output rows {y0}..{y1 - 1}, columns {x0}..{x1 - 1} */")
        for i, (op, gathers) in enumerate(zip(ops, tile["steps"])):
            ptrs = []
            for j, g in enumerate(gathers):
                a = g["from"]
                src = f"ET_F({base_in})" if a == 0 else f"ET_F({ws + buf[f't{a}']})"
                if reader and a == 0 and not g["copy"]:
                    raise EmitError("a patch reads the input batch in place, which is in storage")
                if not g["copy"]:
                    ptrs.append(src)
                    continue
                ra = reg[a]
                cy, ch, cx, cw = g["crop"]
                top, bottom, left, right = g["pad"]
                dst = f"ET_F({ws + buf[f'g{i}.{j}']})"
                if reader and a == 0:  # the region (the whole batch's coordinates) read where it lies
                    lines.append(f"ET_TRY(et_patch_read({reader}, {n}, {shapes[0][1]}, {ra[1] - ra[0]}, "
                                 f"{ra[3] - ra[2]}, {cy}, {ch}, {cx}, {cw}, {top}, {bottom}, {left}, {right}, {dst}));")
                else:
                    lines.append(f"et_patch_gather({n}, {shapes[a][1]}, {ra[1] - ra[0]}, {ra[3] - ra[2]}, {src}, {cy}, "
                                 f"{ch}, {cx}, {cw}, {top}, {bottom}, {left}, {right}, {dst});")
                ptrs.append(dst)
            out = f"ET_F({ws + buf[f't{i + 1}']})"
            r = reg[i + 1]
            count = _count(n, shapes[i + 1][1], r)
            if op["op"] == "conv":
                w = params[op["weight"]]
                bias = "NULL" if op["bias"] is None else ctx.pident[params[op["bias"]]]
                shape = _conv_shape(n, shapes, i, gathers[0], r, op, param_shapes[w]["shape"][2:])  # each tile's own
                # In a block of its own: a compound literal lives to the end of its block, and hundreds of them
                # in the step's function scope took 30 KB of stack (a 16 KB stack: a fault under QEMU).
                lines.append(f"{{ et_conv2d_forward(&(const et_conv2d_shape){{{shape}}}, {ptrs[0]}, "
                             f"{ctx.pident[w]}, {bias}, {out}); }}")
            elif op["op"] == "hardtanh":
                if [float(v) for v in op["literals"]] != [0.0, 6.0]:
                    raise EmitError("only hardtanh(0, 6) (ReLU6) has a C kernel")
                lines.append(f"et_relu6_forward({count}, {ptrs[0]}, {out});")
            elif op["op"] == "relu":
                lines.append(f"et_relu_forward({count}, {ptrs[0]}, {out});")
            else:
                lines.append(f"et_add_forward({count}, {ptrs[0]}, {ptrs[1]}, {out});")
        lines.append(f"et_patch_place({n}, {shapes[m][1]}, {y1 - y0}, {x1 - x0}, ET_F({ws + buf[f't{m}']}), "
                     f"{shapes[m][2]}, {shapes[m][3]}, {y0}, {x0}, ET_F({base_out}));")
    return lines


def emit_q8_patches(node, offsets: dict[str, int], ctx, param_shapes: dict, tables: dict, namer,
                    reader: str | None = None) -> list[str]:
    """An int8 prefix computed patch by patch (the plan's "dtype" int8) as C: as `emit_patches`, with int8 patches
    at the plan's byte offsets (multiples of 4) in the workspace, a convolution's operand padded with its input's
    zero point and run with its per-channel requantisation (`tables`, by layer: const data, as q8_emit.py's),
    its int16 scratch after the patches; the quantisation reads its crop of the float input (through `reader`,
    as `emit_patches`, where it is in storage)."""
    from .q8_emit import requant_table

    plan = json.loads(node.attrs["args"][2])
    shapes, ops = plan["tensors"], plan["ops"]
    m = len(shapes) - 1
    base_in = None if reader else offsets[node.inputs[0].name]
    base_out, ws = offsets[node.name], offsets[f"{node.name}.patches"]
    buf = {k: ws + v // 4 for k, v in plan["buffers"].items()}  # arena words: every buffer starts on one
    scratch = f"(int16_t *)(void *)ET_F({ws + plan['workspace_bytes'] // 4})"
    n = shapes[0][0]
    lines = [f"/* {len(plan['tiles'])} int8 tiles of {c_comment(', '.join(plan['replaces']))} */"]
    for k, tile in enumerate(plan["tiles"]):
        reg = tile["regions"]
        y0, y1, x0, x1 = reg[m]
        lines.append(f"/* tile {k}: output rows {y0}..{y1 - 1}, columns {x0}..{x1 - 1} */")
        for i, (op, gathers) in enumerate(zip(ops, tile["steps"])):
            q, out = op["q8"], f"ET_Q({buf[f't{i + 1}']})"
            r = reg[i + 1]
            count = _count(n, shapes[i + 1][1], r)
            if op["op"] == "q8_quantize":  # from the float input, its crop
                g, a = gathers[0], gathers[0]["from"]
                cy, ch, cx, cw = g["crop"]
                shape = f"{n}, {shapes[a][1]}, {shapes[a][2]}, {shapes[a][3]}"
                where = f"{c_float(q['scale'])}, {q['zp']}, {out}"
                lines.append(f"ET_TRY(et_q8_patch_quantize_read({reader}, {shape}, {cy}, {ch}, {cx}, {cw}, {where}));"
                             if reader else
                             f"et_q8_patch_quantize({shape}, ET_F({base_in}), {cy}, {ch}, {cx}, {cw}, {where});")
                continue
            ptrs = []
            pad = q["x_zp"] if op["op"] == "q8_conv2d" else 0
            for j, g in enumerate(gathers):
                a = g["from"]
                src = f"ET_Q({base_in})" if a == 0 else f"ET_Q({buf[f't{a}']})"
                if not g["copy"]:
                    ptrs.append(src)
                    continue
                ra = reg[a]
                cy, ch, cx, cw = g["crop"]
                top, bottom, left, right = g["pad"]
                dst = f"ET_Q({buf[f'g{i}.{j}']})"
                lines.append(f"et_q8_patch_gather({n}, {shapes[a][1]}, {ra[1] - ra[0]}, {ra[3] - ra[2]}, {src}, "
                             f"{cy}, {ch}, {cx}, {cw}, {top}, {bottom}, {left}, {right}, {pad}, {dst});")
                ptrs.append(dst)
            if op["op"] == "q8_conv2d":
                layer = plan["replaces"][i]
                if layer not in tables:
                    tables[layer] = requant_table(layer, q, namer(layer, "q"))
                bias = ctx.pident[q["bias"]] if q["bias"] else "NULL"
                shape = _conv_shape(n, shapes, i, gathers[0], r, op, param_shapes[q["weight"]]["shape"][2:])
                lines.append(f"{{ et_q8_conv2d_forward(&(const et_conv2d_shape){{{shape}}}, {ptrs[0]}, {q['x_zp']}, "
                             f"{ctx.pident[q['weight']]}, {bias}, &{tables[layer]['ident']}, {scratch}, {out}); }}")
            elif op["op"] == "q8_relu6":
                lines.append(f"et_q8_relu6_forward({count}, {ptrs[0]}, {q['zp']}, {q['q6']}, {out});")
            elif op["op"] == "q8_relu":
                lines.append(f"et_q8_relu_forward({count}, {ptrs[0]}, {q['zp']}, {out});")
            elif op["op"] == "q8_add":
                lines.append(f"et_q8_add({count}, {ptrs[0]}, {c_float(q['a'][0])}, {q['a'][1]}, {ptrs[1]}, "
                             f"{c_float(q['b'][0])}, {q['b'][1]}, {c_float(q['scale'])}, {q['zp']}, {out});")
            else:
                raise EmitError(f"an int8 patch op {op['op']} has no kernel")
        lines.append(f"et_q8_patch_place({n}, {shapes[m][1]}, {y1 - y0}, {x1 - x0}, ET_Q({buf[f't{m}']}), "
                     f"{shapes[m][2]}, {shapes[m][3]}, {y0}, {x0}, ET_Q({base_out}));")
    return lines
