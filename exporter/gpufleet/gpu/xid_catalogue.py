"""NVIDIA's XID catalogue and NVML's GPU recovery actions, as data: what each code
means, what NVIDIA says to do about it, and the text dcgm-exporter puts in ``err_msg``.

Sources (tables of facts, copied with their source named):

- NVIDIA's XID catalogue (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
  sheet "Catalog"), as generated into leptonai/gpud's
  ``components/accelerator/nvidia/xid/catalog_generated.go`` on 2025-10-29: code,
  mnemonic, description, immediate and investigatory resolution buckets, codes 1-172.
- dcgm-exporter's ``internal/pkg/collector/xid_errors.go`` (main branch, 2026-05): the
  ``err_msg`` text for codes 0-172; any other code is "Unknown Error" there.
- NVML's ``nvmlDeviceGpuRecoveryAction_t`` (go-nvml ``pkg/nvml/nvml.h``, 2026-07) for
  the recovery actions, and DCGM's ``modules/health/DcgmHealthWatch.cpp``
  (``MonitorGpuRecoveryAction``) for which of them DCGM fails and which it warns on.

gpufleet's class of each code is derived from NVIDIA's two buckets by ``xid_class``;
``CLASS_OVERRIDES`` holds the few codes where the catalogue gives no bucket (or where
its buckets would mislead), each with why.
"""
# ruff: noqa: E501  (one catalogue row per line reads best, as in the sources)

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

CATALOGUE_URL = "docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CATALOGUE_DATE = "2025-10-29"  # the copy gpufleet's table holds
UNKNOWN_MESSAGE = "Unknown Error"  # dcgm-exporter's err_msg for a code outside its table


class XidClass(StrEnum):
    """What gpufleet does with an XID (the ``class`` label of the catalogue's info series)."""

    ACT_NOW = "act_now"  # critical, GpuFleetCriticalXid: reset, reboot, NVIDIA's workflows
    MAINTENANCE = "maintenance"  # warning, GpuFleetMaintenanceXid: a person investigates
    APPLICATION = "application"  # job level, GpuFleetApplicationXid: restart the application
    INFORMATIONAL = "informational"  # no alert: nothing to do, nothing to investigate
    RECOVERY_ACTION = "recovery_action"  # 154: the GPU's recovery action says what to do
    UNCLASSIFIED = "unclassified"  # warning, GpuFleetUnclassifiedXid: "Unused", or unknown


@dataclass(frozen=True, slots=True)
class XidRow:
    """One row of NVIDIA's catalogue, with dcgm-exporter's text for the code."""

    code: int
    mnemonic: str
    description: str  # NVIDIA's; "Unused" for codes no current data-centre GPU reports
    immediate: str  # NVIDIA's immediate resolution bucket (blank for 162-172)
    investigatory: str  # NVIDIA's investigatory resolution bucket
    dcgm_text: str  # dcgm-exporter's err_msg


# fmt: off
XID_ROWS: tuple[XidRow, ...] = (
    XidRow(0, "", "No Error", "", "", "No Error"),
    XidRow(1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "Unused", "CONTACT_SUPPORT", "", "Invalid or corrupted push buffer stream"),
    XidRow(2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "", "Invalid or corrupted push buffer stream"),
    XidRow(3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "Unused", "CONTACT_SUPPORT", "", "Invalid or corrupted push buffer stream"),
    XidRow(4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "Unused", "CONTACT_SUPPORT", "", "Invalid or corrupted push buffer stream"),
    XidRow(5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "Unused", "CONTACT_SUPPORT", "", "Invalid or corrupted push buffer stream"),
    XidRow(7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "Unused", "CONTACT_SUPPORT", "", "Invalid or corrupted push buffer address"),
    XidRow(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP", "CONTACT_SUPPORT", "GPU stopped processing"),
    XidRow(9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Unused", "CONTACT_SUPPORT", "", "Driver error programming GPU"),
    XidRow(10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream", "RESTART_APP", "CHECK_APP/CUDA", "Invalid or corrupted push buffer stream"),
    XidRow(12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "", "Driver error handling GPU exception"),
    XidRow(13, "ROBUST_CHANNEL_GR_EXCEPTION /\nROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "Graphics Engine Exception", "RESTART_APP", "WORKFLOW_XID_13", "Graphics Engine Exception"),
    XidRow(14, "ROBUST_CHANNEL_FAKE_ERROR", "Unused", "IGNORE", "CONTACT_SUPPORT", "Unused"),
    XidRow(15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Unused", "CONTACT_SUPPORT", "CONTACT_SUPPORT", "Display engine hung"),
    XidRow(17, "ROBUST_CHANNEL_PARAMETER_ERROR", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Unused", "CONTACT_SUPPORT", "", "Bus mastering disabled in PCI Config Space"),
    XidRow(19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Unused", "CONTACT_SUPPORT", "", "Display Engine error"),
    XidRow(20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "", "Invalid or corrupted Mpeg push buffer"),
    XidRow(21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "", "Invalid or corrupted Motion Estimation push buffer"),
    XidRow(22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Unused", "CONTACT_SUPPORT", "", "Invalid or corrupted Video Processor push buffer"),
    XidRow(23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "", "GPU semaphore timeout"),
    XidRow(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", "RESTART_APP", "CHECK_APP/CUDA", "Invalid or illegal push buffer stream"),
    XidRow(26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "Unused", "CONTACT_SUPPORT", "", "Framebuffer timeout"),
    XidRow(27, "ROBUST_CHANNEL_VP_ERROR", "Unused", "CONTACT_SUPPORT", "", "Video processor exception"),
    XidRow(28, "ROBUST_CHANNEL_VP2_ERROR", "Unused", "CONTACT_SUPPORT", "", "Video processor exception"),
    XidRow(29, "ROBUST_CHANNEL_BSP_ERROR", "Unused", "CONTACT_SUPPORT", "", "Video processor exception"),
    XidRow(30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Unused", "CONTACT_SUPPORT", "", "GPU semaphore access error"),
    XidRow(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP", "WORKFLOW_XID_31", "GPU memory page fault"),
    XidRow(32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "RESTART_APP", "CHECK_APP/CUDA", "Invalid or corrupted push buffer stream"),
    XidRow(33, "ROBUST_CHANNEL_SEC_ERROR", "Unused", "CONTACT_SUPPORT", "", "Internal micro-controller error"),
    XidRow(34, "ROBUST_CHANNEL_MSVLD_ERROR", "Unused", "CONTACT_SUPPORT", "", "Video processor exception"),
    XidRow(35, "ROBUST_CHANNEL_MSPDEC_ERROR", "Unused", "CONTACT_SUPPORT", "", "Video processor exception"),
    XidRow(36, "ROBUST_CHANNEL_MSPPP_ERROR", "Unused", "CONTACT_SUPPORT", "", "Video processor exception"),
    XidRow(37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", "IGNORE", "CHECK_APP/CUDA", "Driver firmware error"),
    XidRow(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "IGNORE", "CONTACT_SUPPORT", "Driver firmware error"),
    XidRow(39, "ROBUST_CHANNEL_CE0_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT", "Unused"),
    XidRow(40, "ROBUST_CHANNEL_CE1_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT", "Unused"),
    XidRow(41, "ROBUST_CHANNEL_CE2_ERROR", "Copy Engine Exception", "RESTART_APP", "CONTACT_SUPPORT", "Unused"),
    XidRow(42, "ROBUST_CHANNEL_VIC_ERROR", "Unused", "CONTACT_SUPPORT", "", "Video processor exception"),
    XidRow(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE", "CONTACT_SUPPORT", "GPU stopped processing"),
    XidRow(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", "IGNORE", "CONTACT_SUPPORT", "Graphics Engine fault during context switch"),
    XidRow(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda applications and hitting a DBE", "WORKFLOW_XID_45", "Solo: RESTART_FM\nNot Solo: IGNORE (follow other Xid)", "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda"),
    XidRow(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU", "CONTACT_SUPPORT", "GPU stopped processing"),
    XidRow(47, "ROBUST_CHANNEL_NVENC0_ERROR", "Unused", "CONTACT_SUPPORT", "", "Video processor exception"),
    XidRow(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", "WORKFLOW_XID_48", "Double Bit ECC Error"),
    XidRow(49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS", "CONTACT_SUPPORT", "Auxiliary power is not connected to the GPU board"),
    XidRow(55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Unused", "CONTACT_SUPPORT", "", "Unused"),
    XidRow(56, "DISPLAY_CHANNEL_EXCEPTION", "Unused", "CONTACT_SUPPORT", "", "Display Engine error"),
    XidRow(57, "FB_LINK_TRAINING_FAILURE_ERROR", "Unused", "CONTACT_SUPPORT", "", "Error programming video memory interface"),
    XidRow(58, "FB_MEMORY_ERROR", "Unused", "CONTACT_SUPPORT", "", "Unstable video memory interface detected"),
    XidRow(59, "PMU_ERROR", "Unused", "CONTACT_SUPPORT", "", "Internal micro-controller error"),
    XidRow(60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "RESTART_APP", "INVESTIGATE_SW", "Video processor exception"),
    XidRow(61, "PMU_BREAKPOINT", "Unused", "CONTACT_SUPPORT", "", "Internal micro-controller breakpoint/warning"),
    XidRow(62, "PMU_HALT_ERROR", "Internal micro-controller halt\n(newer drivers)", "RESET_GPU", "CONTACT_SUPPORT", "Internal micro-controller halt"),
    XidRow(63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE", "IGNORE", "ECC page retirement or row remapping recording event"),
    XidRow(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU", "CONTACT_SUPPORT", "ECC page retirement or row remapper recording failure"),
    XidRow(65, "ROBUST_CHANNEL_NVENC1_ERROR", "Unused", "CONTACT_SUPPORT", "", "Video processor exception"),
    XidRow(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", "IGNORE", "INVESTIGATE_SW", "Illegal access by driver"),
    XidRow(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "IGNORE", "CONTACT_SUPPORT", "Illegal access by driver"),
    XidRow(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP", "CONTACT_SUPPORT", "NVDEC0 Exception"),
    XidRow(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP", "CHECK_APP/CUDA", "Graphics Engine class error"),
    XidRow(70, "ROBUST_CHANNEL_CE3_ERROR", "CE3: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "CE3: Unknown Error"),
    XidRow(71, "ROBUST_CHANNEL_CE4_ERROR", "CE4: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "CE4: Unknown Error"),
    XidRow(72, "ROBUST_CHANNEL_CE5_ERROR", "CE5: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "CE5: Unknown Error"),
    XidRow(73, "ROBUST_CHANNEL_NVENC2_ERROR", "Unused", "CONTACT_SUPPORT", "", "NVENC2 Error"),
    XidRow(74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", "NVLINK Error"),
    XidRow(75, "ROBUST_CHANNEL_CE6_ERROR", "CE6: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "CE6: Unknown Error"),
    XidRow(76, "ROBUST_CHANNEL_CE7_ERROR", "CE7: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "CE7: Unknown Error"),
    XidRow(77, "ROBUST_CHANNEL_CE8_ERROR", "CE8: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "CE8: Unknown Error"),
    XidRow(78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW", "UPDATE_SWFW", "vGPU Start Error"),
    XidRow(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM", "CONTACT_SUPPORT", "GPU has fallen off the bus"),
    XidRow(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "RESTART_APP", "CHECK_APP/CUDA", "Corrupted data sent to GPU"),
    XidRow(81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "Unused", "CONTACT_SUPPORT", "", "VGA Subsystem Error"),
    XidRow(82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVJPG0 Error"),
    XidRow(83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVDEC1 Error"),
    XidRow(84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVDEC2 Error"),
    XidRow(85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "CE9: Unknown Error"),
    XidRow(86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception", "RESTART_APP", "CONTACT_SUPPORT", "OFA Exception"),
    XidRow(87, "NVTELEMETRY_DRIVER_REPORT", "Unused", "CONTACT_SUPPORT", "", "Reserved"),
    XidRow(88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVDEC3 Error"),
    XidRow(89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVDEC4 Error"),
    XidRow(90, "LTC_ERROR", "Unused", "CONTACT_SUPPORT", "", "Reserved"),
    XidRow(91, "RESERVED_XID", "Unused", "CONTACT_SUPPORT", "", "Reserved"),
    XidRow(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE", "CONTACT_SUPPORT", "High single-bit ECC error rate"),
    XidRow(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit", "IGNORE", "CONTACT_SUPPORT", "Non-fatal violation of provisioned InfoROM wear limit"),
    XidRow(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP", "IGNORE (sympathetic)", "Contained ECC error"),
    XidRow(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU", "IGNORE (sympathetic)", "Uncontained ECC error"),
    XidRow(96, "ROBUST_CHANNEL_NVDEC5_ERROR", "NVDEC5 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVDEC5 Error"),
    XidRow(97, "ROBUST_CHANNEL_NVDEC6_ERROR", "NVDEC6 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVDEC6 Error"),
    XidRow(98, "ROBUST_CHANNEL_NVDEC7_ERROR", "NVDEC7 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVDEC7 Error"),
    XidRow(99, "ROBUST_CHANNEL_NVJPG1_ERROR", "NVJPG1 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVJPG1 Error"),
    XidRow(100, "ROBUST_CHANNEL_NVJPG2_ERROR", "NVJPG2 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVJPG2 Error"),
    XidRow(101, "ROBUST_CHANNEL_NVJPG3_ERROR", "NVJPG3 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVJPG3 Error"),
    XidRow(102, "ROBUST_CHANNEL_NVJPG4_ERROR", "NVJPG4 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVJPG4 Error"),
    XidRow(103, "ROBUST_CHANNEL_NVJPG5_ERROR", "NVJPG5 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVJPG5 Error"),
    XidRow(104, "ROBUST_CHANNEL_NVJPG6_ERROR", "NVJPG6 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVJPG6 Error"),
    XidRow(105, "ROBUST_CHANNEL_NVJPG7_ERROR", "NVJPG7 Error", "RESTART_APP", "CONTACT_SUPPORT", "NVJPG7 Error"),
    XidRow(106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE", "IGNORE", "SMBPBI Test Message"),
    XidRow(107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE", "IGNORE", "SMBPBI Test Message Silent"),
    XidRow(108, "NVLINK_REMOTE_TRANSLATION_ERROR", "Unused", "IGNORE", "XID_137_FLOW", "Reserved"),
    XidRow(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU", "CONTACT_SUPPORT", "Context Switch Timeout Error"),
    XidRow(110, "SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU", "INVESTIGATE_SW", "Security Fault Error"),
    XidRow(111, "BUNDLE_ERROR_EVENT", "Unused", "CONTACT_SUPPORT", "", "Display Bundle Error Event"),
    XidRow(112, "DISP_SUPERVISOR_ERROR", "Unused", "CONTACT_SUPPORT", "", "Display Supervisor Error"),
    XidRow(113, "DP_LT_FAILURE", "Unused", "CONTACT_SUPPORT", "", "DP Link Training Error"),
    XidRow(114, "HEAD_RG_UNDERFLOW", "Unused", "CONTACT_SUPPORT", "", "Display Pipeline Underflow Error"),
    XidRow(115, "CORE_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "", "Display Core Channel Error"),
    XidRow(116, "WINDOW_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "", "Display Window Channel Error"),
    XidRow(117, "CURSOR_CHANNEL_REGS", "Unused", "CONTACT_SUPPORT", "", "Display Cursor Channel Error"),
    XidRow(118, "HEAD_REGS", "Unused", "CONTACT_SUPPORT", "", "Display Pixel Pipeline Error"),
    XidRow(119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", "INVESTIGATE_SW", "GSP RPC Timeout"),
    XidRow(120, "GSP_ERROR", "GSP Error", "RESET_GPU", "INVESTIGATE_SW", "GSP Error"),
    XidRow(121, "C2C_ERROR", "C2C Error", "IGNORE", "CONTACT_SUPPORT", "C2C Link Error"),
    XidRow(122, "SPI_PMU_RPC_READ_FAIL", "Unused", "CONTACT_SUPPORT", "", "SPI PMU RPC Read Failure"),
    XidRow(123, "SPI_PMU_RPC_WRITE_FAIL", "Unused", "CONTACT_SUPPORT", "", "SPI PMU RPC Write Failure"),
    XidRow(124, "SPI_PMU_RPC_ERASE_FAIL", "Unused", "CONTACT_SUPPORT", "", "SPI PMU RPC Erase Failure"),
    XidRow(125, "INFOROM_FS_ERROR", "Unused", "CONTACT_SUPPORT", "", "Inforom FS Failure"),
    XidRow(126, "ROBUST_CHANNEL_CE10_ERROR", "CE10: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE10 Error"),
    XidRow(127, "ROBUST_CHANNEL_CE11_ERROR", "CE11: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE11 Error"),
    XidRow(128, "ROBUST_CHANNEL_CE12_ERROR", "CE12: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE12 Error"),
    XidRow(129, "ROBUST_CHANNEL_CE13_ERROR", "CE13: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE13 Error"),
    XidRow(130, "ROBUST_CHANNEL_CE14_ERROR", "CE14: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE14 Error"),
    XidRow(131, "ROBUST_CHANNEL_CE15_ERROR", "CE15: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE15 Error"),
    XidRow(132, "ROBUST_CHANNEL_CE16_ERROR", "CE16: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE16 Error"),
    XidRow(133, "ROBUST_CHANNEL_CE17_ERROR", "CE17: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE17 Error"),
    XidRow(134, "ROBUST_CHANNEL_CE18_ERROR", "CE18: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE18 Error"),
    XidRow(135, "ROBUST_CHANNEL_CE19_ERROR", "CE19: Unknown Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel CE19 Error"),
    XidRow(136, "ALI_TRAINING_FAIL", "Link Training Failed", "RESET_GPU", "INVESTIGATE_LINK_SI", "ALI Training Fail"),
    XidRow(137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", "IGNORE", "XID_137_FLOW", "NVLink Privilege Error"),
    XidRow(138, "ROBUST_CHANNEL_DLA_ERROR", "Unused", "CONTACT_SUPPORT", "", "Robust Channel DLA Error"),
    XidRow(139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP", "CONTACT_SUPPORT", "Robust Channel OFA1 Error"),
    XidRow(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU", "CONTACT_SUPPORT", "Unrecovered ECC Error"),
    XidRow(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE", "CONTACT_SUPPORT", "Robust Channel Fast Path Error"),
    XidRow(142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT", "", "Robust Channel NVENVC3 Error"),
    XidRow(143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU", "CONTACT_SUPPORT", "GPU Initialization Failure"),
    XidRow(144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "NVLINK: Saw Error"),
    XidRow(145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "NVLINK: RLW Error"),
    XidRow(146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "NVLINK: TLW Error"),
    XidRow(147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "NVLINK: TREX Error"),
    XidRow(148, "NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "NVLINK: NVLPW_CTRL Error"),
    XidRow(149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "NVLINK: NETIR Error"),
    XidRow(150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", "NVLINK: MSE Error"),
    XidRow(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM", "CONTACT_SUPPORT", "Robust Channel Key rotation Error"),
    XidRow(152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "DLA SMMU Error", "IGNORE", "CONTACT_SUPPORT", "Robust Channel DLA SMMU Error"),
    XidRow(153, "ROBUST_CHANNEL_DLA_TIMEOUT", "DLA timeout Error", "IGNORE", "CONTACT_SUPPORT", "Robust Channel DLA timeout Error"),
    XidRow(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154", "N/A Informational only regarding another Xid", "GPU Recovery Action Changed"),
    XidRow(155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", "RESET_GPU", "INVESTIGATE_SW_USER", "NVLINK: SW Defined Error"),
    XidRow(156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU", "IGNORE", "Resource Retirement Event"),
    XidRow(157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "IGNORE", "CONTACT_SUPPORT", "Resource Retirement Failure"),
    XidRow(158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU", "CONTACT_SUPPORT", "GPU Fatal Timeout"),
    XidRow(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO", "Robust Channel CHI Non-Data Error"),
    XidRow(160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", "IGNORE", "INVESTIGATE_SW", "Channel Retirement Event"),
    XidRow(161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", "IGNORE", "INVESTIGATE_SW", "Channel Retirement Failure"),
    XidRow(162, "PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", "", "", "Power Smoothing HW Circuitry Reengaged"),
    XidRow(163, "PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", "", "", "Power Smoothing HW Circuitry Disengaged"),
    XidRow(164, "PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", "", "", "Power Smoothing HW Circuitry Low Lifetime"),
    XidRow(165, "PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", "", "", "Power Smoothing HW Circuitry Lifetime Exhausted"),
    XidRow(166, "NVLINK_SECURE_CRYPTO_ERR", "CC traffic seen prior to link properly being configured for encrypted traffic", "", "", "NVLINK Secure Crypto Error"),
    XidRow(167, "PCIE_FATAL_TIMEOUT", "PCIE_FATAL_TIMEOUT", "", "", "PCIE Fatal Timeout"),
    XidRow(168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", "", "", "Reduced GPU Memory Capacity (Errors found in write protection region)"),
    XidRow(169, "SEC2_HALT_ERROR", "Internal micro-controller halt", "", "", "Internal micro-controller halt"),
    XidRow(170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", "", "", "NVLINK: Interrupt seen in CC mode"),
    XidRow(171, "UNCORRECTABLE_DRAM_ERROR", "Additional to Xid 48 providing more details on particulars of fault to differentiate DRAM/SRAM", "", "", "Uncorrectable DRAM Error"),
    XidRow(172, "UNCORRECTABLE_SRAM_ERROR", "Additional to Xid 48 providing more details on particulars of fault to differentiate DRAM/SRAM", "", "", "Uncorrectable SRAM Error"),
)
# fmt: on

# NVIDIA's immediate buckets that take the GPU (or the node) out of service now.
_TAKES_THE_GPU = frozenset({
    "RESET_GPU", "RESTART_BM", "RESTART_VM", "CHECK_MECHANICALS",
    "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR",
})  # fmt: skip
# Immediate buckets about the application that hit the error, not the GPU.
_THE_APPLICATION = frozenset({"RESTART_APP", "WORKFLOW_XID_45"})
# Investigatory buckets that leave nothing for a person to do.
_NOTHING_TO_INVESTIGATE = frozenset({"", "IGNORE"})


@dataclass(frozen=True, slots=True)
class ClassOverride:
    klass: XidClass
    action: str  # gpufleet's words, where NVIDIA's buckets give none
    why: str


CLASS_OVERRIDES: dict[int, ClassOverride] = {
    # IGNORE / CONTACT_SUPPORT would make it a maintenance warning for every killed job:
    # NVIDIA's XID document says 43 is logged when a user application hits a
    # software-induced fault and must terminate, and the GPU remains healthy.
    43: ClassOverride(XidClass.APPLICATION, "", "the application's fault; the GPU stays healthy"),
    # 162-172 have no buckets in the catalogue (2025-10-29): gpufleet's choice, by what
    # the description says the GPU lost.
    162: ClassOverride(XidClass.INFORMATIONAL, "no action: power smoothing is back on",
                       "a capability came back"),
    163: ClassOverride(XidClass.MAINTENANCE, "no immediate action; find out why power smoothing disengaged (contact NVIDIA support if it stays off)",
                       "the GPU runs on, without power smoothing"),
    164: ClassOverride(XidClass.MAINTENANCE, "no immediate action; plan the board's replacement with NVIDIA support",
                       "power smoothing near its end of life: plan, not page"),
    165: ClassOverride(XidClass.MAINTENANCE, "no immediate action; contact NVIDIA support about replacing the board",
                       "power smoothing exhausted: the GPU runs on without it"),
    166: ClassOverride(XidClass.MAINTENANCE, "no immediate action; check the confidential-computing NVLink setup",
                       "a configuration error in confidential computing"),
    167: ClassOverride(XidClass.ACT_NOW, "drain the node and reset the GPU or reboot the node; contact NVIDIA support if it recurs",
                       "a fatal PCIe timeout: the GPU cannot be trusted to answer"),
    168: ClassOverride(XidClass.ACT_NOW, "drain the node and reset the GPU; contact NVIDIA support if memory stays reduced",
                       "the GPU runs with less memory than jobs expect"),
    169: ClassOverride(XidClass.ACT_NOW, "drain the node and reset the GPU; contact NVIDIA support if it recurs",
                       "a micro-controller halt, as 62 (RESET_GPU)"),
    170: ClassOverride(XidClass.MAINTENANCE, "no immediate action; check the confidential-computing NVLink setup",
                       "an interrupt in confidential-computing mode, no loss reported"),
    171: ClassOverride(XidClass.ACT_NOW, "as XID 48 (uncorrectable DRAM error): drain the node and reset the GPU",
                       "details a 48, which NVIDIA's XID 48 workflow handles"),
    172: ClassOverride(XidClass.ACT_NOW, "as XID 48 (uncorrectable SRAM error): drain the node and reset the GPU",
                       "details a 48, which NVIDIA's XID 48 workflow handles"),
}  # fmt: skip


def xid_class(row: XidRow) -> XidClass:
    """gpufleet's class of a catalogue row, from NVIDIA's two resolution buckets."""
    override = CLASS_OVERRIDES.get(row.code)
    if override is not None:
        return override.klass
    immediate, investigatory = _bucket(row.immediate), _bucket(row.investigatory)
    if row.description == "Unused" or not immediate:
        return XidClass.UNCLASSIFIED
    if immediate == "XID_154":
        return XidClass.RECOVERY_ACTION
    if immediate in _TAKES_THE_GPU:
        return XidClass.ACT_NOW
    if immediate in _THE_APPLICATION:
        return XidClass.APPLICATION
    if immediate == "IGNORE":
        if investigatory in _NOTHING_TO_INVESTIGATE:
            return XidClass.INFORMATIONAL
        if investigatory == "CHECK_APP/CUDA":
            return XidClass.APPLICATION
        return XidClass.MAINTENANCE
    if immediate in {"CONTACT_SUPPORT", "UPDATE_SWFW", "CHECK_UVM"}:
        return XidClass.MAINTENANCE
    raise ValueError(f"XID {row.code}: no class for NVIDIA's immediate bucket {immediate!r}")


# NVIDIA's buckets in plain words.
IMMEDIATE_WORDS = {
    "RESET_GPU": "drain the node and reset the GPU",
    "RESTART_BM": "drain the node and reboot it",
    "RESTART_VM": "restart the VM",
    "RESTART_APP": "restart the application",
    "IGNORE": "no immediate action",
    "CONTACT_SUPPORT": "contact NVIDIA support",
    "UPDATE_SWFW": "update the driver and firmware",
    "CHECK_MECHANICALS": "drain the node and check the GPU's power cables and seating",
    "CHECK_UVM": "check the unified-memory (UVM) driver",
    "WORKFLOW_XID_48": "drain the node and reset the GPU (NVIDIA's XID 48 workflow)",
    "WORKFLOW_NVLINK_ERR": "drain the node, check the links (nvidia-smi nvlink -e) and reset the GPU (NVIDIA's NVLink error workflow)",
    "WORKFLOW_NVLINK5_ERR": "drain the node and reset the GPU if NVIDIA's XID 144-150 decode table says the unit is fatal",
    "WORKFLOW_XID_45": "look for the XID that preceded it on the same GPU",
    "XID_154": "do what the GPU's recovery action says (GpuFleetGpuRecoveryAction)",
}
INVESTIGATORY_WORDS = {
    "": "",
    "IGNORE": "",
    "N/A Informational only regarding another Xid": "",
    "CONTACT_SUPPORT": "if it recurs, contact NVIDIA support",
    "CHECK_APP/CUDA": "check the application and its CUDA version",
    "WORKFLOW_XID_13": "check the application (NVIDIA's XID 13 workflow)",
    "WORKFLOW_XID_31": "check the application for an illegal memory access (NVIDIA's XID 31 workflow)",
    "WORKFLOW_XID_48": "",
    "WORKFLOW_NVLINK5_ERR": "",
    "INVESTIGATE_SW": "if it recurs, update the driver and firmware (not an RMA)",
    "INVESTIGATE_SW_USER": "if it recurs, investigate the software and the job",
    "INVESTIGATE_LINK_SI": "if it recurs, check the link's signal integrity (cables, connectors)",
    "IGNORE (sympathetic)": "nothing more: it follows another error",
    "SYMPATHETIC_REPORT_SOLO": "usually follows another error; report it to NVIDIA if it comes alone",
    "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)": "alone on an NVSwitch system, restart Fabric Manager; otherwise follow the other XID",
    "UPDATE_SWFW": "update the driver and firmware",
    "XID_137_FLOW": "follow NVIDIA's XID 137 flow (NVLink privilege error)",
}
UNCLASSIFIED_ACTION = "unclassified XID: see NVIDIA's catalogue"


def _bucket(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def xid_meaning(row: XidRow) -> str:
    """NVIDIA's description on one line."""
    return _bucket(row.description)


def xid_action(row: XidRow) -> str:
    """What to do, in plain words naming NVIDIA's immediate and investigatory buckets."""
    override = CLASS_OVERRIDES.get(row.code)
    if xid_class(row) is XidClass.UNCLASSIFIED:
        return UNCLASSIFIED_ACTION
    immediate, investigatory = _bucket(row.immediate), _bucket(row.investigatory)
    if override is not None and override.action:
        return f"{override.action} (NVIDIA's catalogue gives no action: gpufleet's choice)"
    buckets = [immediate] if investigatory == immediate else [immediate, investigatory]
    steps = [IMMEDIATE_WORDS[immediate], *(INVESTIGATORY_WORDS[b] for b in buckets[1:])]
    words = "; ".join(step for step in steps if step)
    named = " / ".join(bucket for bucket in buckets if bucket)
    return f"{words} (NVIDIA: {named})"


@dataclass(frozen=True, slots=True)
class XidEntry:
    """A catalogued code as the rules use it."""

    code: int
    klass: XidClass
    meaning: str
    action: str


CATALOGUE: tuple[XidEntry, ...] = tuple(
    XidEntry(row.code, xid_class(row), xid_meaning(row), xid_action(row))
    for row in XID_ROWS
    if row.code > 0
)
# dcgm-exporter's err_msg for each code it knows.
DCGM_MESSAGES: dict[int, str] = {row.code: row.dcgm_text for row in XID_ROWS}


@dataclass(frozen=True, slots=True)
class RecoveryAction:
    """One of NVML's ``nvmlDeviceGpuRecoveryAction_t`` values."""

    value: int
    nvml: str
    action: str
    urgency: str  # critical where DCGM's health check fails the GPU, warning where it warns


# NONE (0) asks for nothing (urgency none: no alert). DCGM fails the GPU on 1, 2 and
# 4 and warns on 3; it ignores 5, which gpufleet pages as critical: the GPU's NVLink
# domain is unusable until it is recovered. A value gpufleet does not know warns (GpuFleetGpuRecoveryWarning).
# fmt: off
RECOVERY_ACTIONS: tuple[RecoveryAction, ...] = (
    RecoveryAction(0, "NONE", "nothing to do", "none"),
    RecoveryAction(1, "GPU_RESET", "drain the node and reset the GPU", "critical"),
    RecoveryAction(2, "NODE_REBOOT", "drain the node and reboot it", "critical"),
    RecoveryAction(3, "DRAIN_P2P", "drain peer-to-peer (NVLink) traffic from the GPU: no new multi-GPU work on it", "warning"),
    RecoveryAction(4, "DRAIN_AND_RESET", "drain peer-to-peer traffic, then drain the node and reset the GPU", "critical"),
    RecoveryAction(5, "RECOVER_IMEX_DOMAIN", "recover the IMEX (multi-node NVLink) domain the GPU belongs to", "critical"),
)
# fmt: on
