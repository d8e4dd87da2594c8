"""The machine-code check of benchmarks/sass_audit.py on small hand-written listings: a
subroutine called under a per-lane branch that writes a uniform register the other side
reads is found; the same call is not a hazard when the register is written first on the
other side, when the subroutine writes another register, or when the branch is uniform or
on a warp's vote. nvdisasm's listings read as cuobjdump's."""

from benchmarks.sass_audit import hazards, parse_listing


def listing(predicate_def: str, other_side: str, callee_write: str) -> str:
    body = f"""
        Function : kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   ULDC.64 UR24, c[0x0][0x248] ;
        /*0020*/                   {predicate_def} ;
        /*0030*/               @P1 BRA 0x80 ;
        /*0040*/                   {other_side} ;
        /*0050*/                   IMAD R2, R3, UR24, RZ ;
        /*0060*/                   BRA 0xa0 ;
        /*0080*/                   CALL.REL.NOINC 0xc0 ;
        /*0090*/                   BRA 0xa0 ;
        /*00a0*/                   STG.E desc[UR12][R4.64], R2 ;
        /*00b0*/                   EXIT ;
        /*00c0*/                   {callee_write} ;
        /*00d0*/                   RET.REL.NODEC R10 0x0 ;
    """
    return body


PER_LANE = "ISETP.NE.AND P1, PT, R0, 0x1, PT"
UNIFORM = "ISETP.NE.U32.AND P1, PT, RZ, UR5, PT"
FROM_UNIFORM_PREDICATE = "PLOP3.LUT P1, PT, PT, PT, UP0, 0x80, 0x0"
NOTHING = "NOP"
CLOBBER = "UIADD3 UR24, UR4, 0x1, URZ"


def check(predicate_def, other_side, callee_write):
    (name, ins), = parse_listing(listing(predicate_def, other_side, callee_write)).items()
    assert name == "kernel" and len(ins) == 13
    return hazards(ins)


def test_a_clobbered_uniform_register_is_found():
    assert check(PER_LANE, NOTHING, CLOBBER) == [(0x30, (24,))]


def test_a_descriptor_pair_counts_both_registers():
    assert check(PER_LANE, NOTHING, "R2UR UR12, R68") == [(0x30, (12,))]
    assert check(PER_LANE, NOTHING, "ULDC.64 UR12, c[0x0][0x208]") == [(0x30, (12, 13))]


def test_no_hazard_when_the_other_side_writes_it_first():
    assert check(PER_LANE, "ULDC.64 UR24, c[0x0][0x248]", CLOBBER) == []


def test_no_hazard_when_the_subroutine_writes_other_registers():
    assert check(PER_LANE, NOTHING, "UIADD3 UR30, UR4, 0x1, URZ") == []


def test_no_hazard_at_a_branch_on_a_vote():
    """A warp's vote (the careful choice of groups.cuh's warp_careful) gives every lane
    the same answer, though its predicate register is a lane's."""
    assert check("VOTE.ANY P1, P0", NOTHING, CLOBBER) == []
    assert check("ISETP.NE.AND P1, PT, R0, 0x1, PT", NOTHING, CLOBBER) != []


def test_a_vote_is_found_across_an_earlier_branch():
    """The vote and the branch on it need not be in one straight run of code, and a
    per-lane definition on any path to the branch makes it per lane."""
    text = """
        Function : kernel
        /*0000*/                   ULDC.64 UR24, c[0x0][0x248] ;
        /*0010*/                   VOTE.ANY P1, P0 ;
        /*0020*/               @P2 BRA 0x40 ;
        /*0030*/                   {redefine} ;
        /*0040*/                   BSYNC B1 ;
        /*0050*/               @P1 BRA 0xa0 ;
        /*0060*/                   IMAD R2, R3, UR24, RZ ;
        /*0070*/                   BRA 0xc0 ;
        /*00a0*/                   CALL.REL.NOINC 0xe0 ;
        /*00c0*/                   EXIT ;
        /*00e0*/                   UIADD3 UR24, UR4, 0x1, URZ ;
        /*00f0*/                   RET.REL.NODEC R10 0x0 ;
    """
    (_, ins), = parse_listing(text.format(redefine="NOP")).items()
    assert hazards(ins) == []
    (_, ins), = parse_listing(text.format(redefine=PER_LANE)).items()
    assert hazards(ins) == [(0x50, (24,))]


def test_no_hazard_at_a_uniform_branch():
    assert check(UNIFORM, NOTHING, CLOBBER) == []
    assert check(FROM_UNIFORM_PREDICATE, NOTHING, CLOBBER) == []


def test_nvdisasm_listing_reads_as_cuobjdumps():
    """The hazard of the first test, listed as nvdisasm lists it (labels for targets, a
    section a function), reads as the same instructions and gives the same finding."""
    from benchmarks.sass_audit import from_nvdisasm

    nvdisasm = """
        .section        .text.kernel,"ax",@progbits
.text.kernel:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   ULDC.64 UR24, c[0x0][0x248] ;
        /*0020*/                   ISETP.NE.AND P1, PT, R0, 0x1, PT ;
        /*0030*/               @P1 BRA `(.L_x_1) ;
        /*0040*/                   NOP ;
        /*0050*/                   IMAD R2, R3, UR24, RZ ;
        /*0060*/                   BRA `(.L_x_2) ;
.L_x_1:
        /*0080*/                   CALL.REL.NOINC `($kernel$careful) ;
        /*0090*/                   BRA `(.L_x_2) ;
.L_x_2:
        /*00a0*/                   STG.E desc[UR12][R4.64], R2 ;
        /*00b0*/                   EXIT ;
        .weak           $kernel$careful
$kernel$careful:
        /*00c0*/                   UIADD3 UR24, UR4, 0x1, URZ ;
        /*00d0*/                   RET.REL.NODEC R10 `(kernel) ;
    """
    (name, ins), = parse_listing(from_nvdisasm(nvdisasm)).items()
    (_, want), = parse_listing(listing(PER_LANE, NOTHING, CLOBBER)).items()
    assert name == "kernel"
    assert ins[:-1] == want[:-1] and ins[-1][1].startswith("RET.REL.NODEC R10")
    assert hazards(ins) == hazards(want) == [(0x30, (24,))]
