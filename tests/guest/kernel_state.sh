# What the guest's kernel shows about CPU isolation, as text (run over SSH by
# tests/guest/test_real_kernel.py after the reboot, saved as kernel-state.txt
# beside the test's other files; docs/verify.md reads the same places).
echo "## uname -r"; uname -r
echo "## /proc/cmdline"; cat /proc/cmdline
for f in isolated nohz_full; do echo "## /sys/devices/system/cpu/$f"; cat /sys/devices/system/cpu/$f; done
echo "## lscpu -e"; lscpu -e 2>/dev/null || echo "(no lscpu)"
echo "## /proc/interrupts"; cat /proc/interrupts
echo "## /proc/irq/N: smp_affinity_list effective_affinity_list"
for d in $(ls -d /proc/irq/[0-9]* | sort -t/ -k4 -n); do
    printf '%s %s %s\n' "${d##*/}" "$(cat "$d/smp_affinity_list")" "$(cat "$d/effective_affinity_list")"
done
echo "## /proc/irq/default_smp_affinity"; cat /proc/irq/default_smp_affinity
echo "## debugfs irq"
grep -q ' /sys/kernel/debug ' /proc/mounts || mount -t debugfs none /sys/kernel/debug 2>&1
if [ -d /sys/kernel/debug/irq/irqs ]; then
    for n in $(awk '/virtio/ {sub(":", "", $1); print $1}' /proc/interrupts); do
        echo "### /sys/kernel/debug/irq/irqs/$n"; cat "/sys/kernel/debug/irq/irqs/$n"
    done
else
    echo "no /sys/kernel/debug/irq (the kernel is built without CONFIG_GENERIC_IRQ_DEBUGFS)"
fi
echo "## /sys/devices/virtual/workqueue/cpumask"; cat /sys/devices/virtual/workqueue/cpumask
echo "## threads: pid comm Cpus_allowed_list last-CPU (kernel threads, then the rest)"
for s in /proc/[0-9]*/stat; do
    d=${s%/stat}
    ppid=$(awk '{print $4}' "$s" 2>/dev/null) || continue
    printf '%s %s %s %s %s\n' "$([ "$ppid" = 2 ] || [ "${d#/proc/}" = 2 ] && echo k || echo u)" "${d#/proc/}" \
        "$(cat "$d/comm" 2>/dev/null)" "$(awk '/^Cpus_allowed_list/ {print $2}' "$d/status" 2>/dev/null)" \
        "$(awk '{print $39}' "$s" 2>/dev/null)"
done | sort -k1,1 -k2n
