"""Every alert gpufleet's rules define, named once.

The rules build each ``alert:`` from these members; the simulator's ground truth, the
detection scorer, the fleet report and the lab stack name the alerts they expect
through the same members, so a renamed alert is one edit here.
"""

from __future__ import annotations

from enum import StrEnum


class AlertName(StrEnum):
    # gpu.rules.yaml: per-GPU errors, recovery and presence
    CRITICAL_XID = "GpuFleetCriticalXid"
    MAINTENANCE_XID = "GpuFleetMaintenanceXid"
    UNCLASSIFIED_XID = "GpuFleetUnclassifiedXid"
    GPU_RECOVERY_ACTION = "GpuFleetGpuRecoveryAction"
    GPU_RECOVERY_WARNING = "GpuFleetGpuRecoveryWarning"
    ECC_UNCORRECTABLE = "GpuFleetEccUncorrectable"
    ROW_REMAP_FAILURE = "GpuFleetRowRemapFailure"
    ROW_REMAP_PENDING = "GpuFleetRowRemapPending"
    REMAPS_CLIMBING = "GpuFleetCorrectableRemapsClimbing"
    NVLINK_ERRORS = "GpuFleetNvlinkErrors"
    PCIE_REPLAYS = "GpuFleetPcieReplays"
    HW_SLOWDOWN = "GpuFleetHwSlowdown"
    GPU_LOST = "GpuFleetGpuLost"
    GPU_MISSING = "GpuFleetGpuMissing"
    # node.rules.yaml: the exporters' presence and the node's health
    GPU_EXPORTER_DOWN = "GpuFleetGpuExporterDown"
    GPU_TARGETS_MISSING = "GpuFleetGpuTargetsMissing"
    AGENT_DOWN = "GpuFleetAgentDown"
    AGENT_TARGETS_MISSING = "GpuFleetAgentTargetsMissing"
    TELEMETRY_COLLAPSE = "GpuFleetTelemetryCollapse"
    NODE_HEALTH = "GpuFleetNodeHealthDegraded"
    # training.rules.yaml: fail-slow, hangs, input stalls and application XIDs
    STRAGGLER = "GpuFleetStragglerNode"
    SLOWER_THAN_BASELINE = "GpuFleetNodeSlowerThanBaseline"
    JOB_SLOWDOWN = "GpuFleetJobSlowdown"
    STAGE_IMBALANCE = "GpuFleetStageImbalance"
    REPLICA_IMBALANCE = "GpuFleetReplicaImbalance"
    STRAGGLER_DETECTION_INACTIVE = "GpuFleetStragglerDetectionInactive"
    JOB_HUNG = "GpuFleetJobHung"
    DATA_LOADER_STALL = "GpuFleetDataLoaderStall"
    APPLICATION_XID = "GpuFleetApplicationXid"
    # checkpoint.rules.yaml
    CHECKPOINT_QUEUE_BOUND = "GpuFleetCheckpointQueueBound"
    CHECKPOINT_SLOW = "GpuFleetCheckpointSlow"
    RESTORE_SLOW = "GpuFleetRestoreSlow"
    # layout.rules.yaml: parallelism layout
    TENSOR_PARALLEL_ACROSS_NODES = "GpuFleetTensorParallelAcrossNodes"
    PIPELINE_STAGES_UNEVEN = "GpuFleetPipelineStagesUneven"
    # reliability.rules.yaml: the fleet ledger
    LEDGER_DOWN = "GpuFleetLedgerDown"
    LEDGER_TARGET_MISSING = "GpuFleetLedgerTargetMissing"
    REPEAT_OFFENDER_NODE = "GpuFleetRepeatOffenderNode"
    RETRY_CHAIN_FAILING = "GpuFleetRetryChainFailing"
    EXCLUSION_CONCENTRATION = "GpuFleetExclusionConcentration"
