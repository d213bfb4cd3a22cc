/*
 * startup.c - reset and fault handling for a Cortex-M4F under `qemu-system-arm -M mps2-an386`
 * (and any Cortex-M4F whose flash starts at 0 and RAM at 0x20000000, with link.ld adjusted).
 *
 * Link with -nostartfiles --specs=nano.specs --specs=rdimon.specs -T link.ld. On reset: copy .data from
 * flash, zero .bss, enable the FPU (before any float instruction), open semihosting's stdio
 * (initialise_monitor_handles), run main, and hand its return value to exit(), which semihosting turns
 * into QEMU's exit code. A fault exits through semihosting too, so a crashed run ends QEMU with an
 * error instead of hanging it.
 */
#include <stdint.h>
#include <stdlib.h>

extern uint32_t _sidata, _sdata, _edata, _sbss, _ebss; /* from link.ld */
extern void _estack(void); /* top of the stack; declared as a function so the vector table needs no cast */
extern int main(void);
extern void initialise_monitor_handles(void);

void Reset_Handler(void);
void Fault_Handler(void);

/* -nostartfiles drops crti/crtn; newlib's __libc_init_array still calls these. */
void _init(void) {}
void _fini(void) {}

/* Cortex-M vector table: initial stack pointer, then the exception handlers (16 system entries). */
__attribute__((section(".isr_vector"), used))
void (*const et_vectors[16])(void) = {
    _estack,       /* initial SP */
    Reset_Handler, /* reset */
    Fault_Handler, /* NMI */
    Fault_Handler, /* HardFault */
    Fault_Handler, /* MemManage */
    Fault_Handler, /* BusFault */
    Fault_Handler, /* UsageFault */
    0, 0, 0, 0,    /* reserved */
    Fault_Handler, /* SVCall */
    Fault_Handler, /* DebugMonitor */
    0,             /* reserved */
    Fault_Handler, /* PendSV */
    Fault_Handler, /* SysTick */
};

void Reset_Handler(void)
{
    uint32_t *src = &_sidata, *dst = &_sdata;

    while (dst < &_edata)
        *dst++ = *src++;
    for (dst = &_sbss; dst < &_ebss; ++dst)
        *dst = 0u;
    /* CPACR: full access to coprocessors 10 and 11 (the FPU); barriers so the next instruction sees it. */
    *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20;
    __asm__ __volatile__("dsb\n\tisb" ::: "memory");
    initialise_monitor_handles();
    exit(main());
}

void Fault_Handler(void)
{
    /* SYS_EXIT (0x18) with ADP_Stopped_RunTimeErrorUnknown (0x20023): QEMU exits with status 1. */
    __asm__ __volatile__("mov r0, #0x18\n\tldr r1, =0x20023\n\tbkpt 0xAB" ::: "r0", "r1", "memory");
    for (;;) {
    }
}
